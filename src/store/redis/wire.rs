//! A lane's own socket for charge batches (plain-TCP Redis URLs).
//!
//! Charges are the hot path: under load every request's decision travels in
//! one. Sent through redis-rs, each batch crossed three tasks (the batch
//! runner, a send task and the multiplexed connection's task) and its reply
//! went through a general RESP parser into a tree of values, about 1 µs of
//! application CPU per request. Here the runner writes each batch's `EVALSHA`
//! straight into its own socket and reads the flat reply itself (integers
//! and, for a request that failed inside the script, one error string): no
//! task hop between the runner and the socket, and buffers reused from batch
//! to batch.
//!
//! Only charges use it. Refunds, status reads, concurrency slots and the
//! eviction check stay on redis-rs; so do TLS and Unix-socket URLs, whose
//! charges take the redis-rs path in full (see [`Endpoint::from_url`]).

use super::or_unavailable;
use crate::error::StoreError;
use deadpool_redis::redis::{self, ConnectionAddr, IntoConnectionInfo, Value};
use std::io;
use std::time::Duration;
use tokio::net::TcpStream;

/// Where and how a lane's own socket connects.
#[derive(Debug)]
pub(crate) struct Endpoint {
    host: String,
    port: u16,
    username: Option<String>,
    password: Option<String>,
    db: i64,
    connect_timeout: Duration,
    /// Time allowed for one reply; a connection that misses it is dropped.
    pub(crate) response_timeout: Duration,
}

impl Endpoint {
    /// The endpoint of a plain-TCP `redis://` URL; `None` for TLS and Unix
    /// sockets, whose charges go through redis-rs.
    pub(crate) fn from_url(
        url: &str,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Option<Self> {
        let info = url.into_connection_info().ok()?;
        let ConnectionAddr::Tcp(host, port) = info.addr() else {
            return None;
        };
        let settings = info.redis_settings();
        Some(Endpoint {
            host: host.clone(),
            port: *port,
            username: settings.username().map(str::to_owned),
            password: settings.password().map(str::to_owned),
            db: settings.db(),
            connect_timeout,
            response_timeout,
        })
    }

    /// Opens a connection and authenticates and selects the database as the
    /// URL says, within the connect timeout (the handshake within the
    /// response timeout).
    pub(crate) async fn connect(&self) -> Result<Wire, StoreError> {
        let addr = (self.host.as_str(), self.port);
        let stream = or_unavailable(
            self.connect_timeout,
            "redis connection failed: no connection",
            TcpStream::connect(addr),
        )
        .await?
        .map_err(io_error)?;
        stream.set_nodelay(true).map_err(io_error)?;
        let mut wire = Wire {
            stream,
            read: Vec::with_capacity(READ_CHUNK),
            write: Vec::new(),
            written: 0,
        };
        let mut hello = Vec::new();
        let mut replies = 0;
        if let Some(password) = &self.password {
            let mut auth = redis::cmd("AUTH");
            if let Some(user) = &self.username {
                auth.arg(user);
            }
            auth.arg(password).write_packed_command(&mut hello);
            replies += 1;
        }
        if self.db != 0 {
            redis::cmd("SELECT")
                .arg(self.db)
                .write_packed_command(&mut hello);
            replies += 1;
        }
        if replies > 0 {
            or_unavailable(
                self.response_timeout,
                "redis timed out: no handshake reply",
                wire.handshake(hello, replies),
            )
            .await??;
        }
        Ok(wire)
    }
}

/// How much a read asks the socket for at least.
const READ_CHUNK: usize = 4096;

/// An open connection: the socket and its buffers.
pub(crate) struct Wire {
    pub(crate) stream: TcpStream,
    /// Bytes read and not yet parsed.
    read: Vec<u8>,
    /// Commands to send; `written` of them have been.
    write: Vec<u8>,
    written: usize,
}

/// A connection put aside while its lane is idle: out of the runtime's
/// reactor, so the next runner (maybe on another runtime) can take it up.
pub(crate) struct Parked {
    stream: std::net::TcpStream,
    read: Vec<u8>,
    write: Vec<u8>,
}

impl Wire {
    /// Puts the connection aside; `None` (dropped) if it cannot be.
    pub(crate) fn park(self) -> Option<Parked> {
        if !self.read.is_empty() || self.written < self.write.len() {
            return None;
        }
        Some(Parked {
            stream: self.stream.into_std().ok()?,
            read: self.read,
            write: self.write,
        })
    }

    /// Takes a parked connection up again on the current runtime; `None`
    /// (dropped) if the server closed it meanwhile (its idle `timeout`, a
    /// proxy) or it holds bytes nobody asked for: the next batch then
    /// connects anew instead of failing on it.
    pub(crate) fn resume(p: Parked) -> Option<Wire> {
        match p.stream.peek(&mut [0]) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            _ => return None,
        }
        Some(Wire {
            stream: TcpStream::from_std(p.stream).ok()?,
            read: p.read,
            write: p.write,
            written: 0,
        })
    }

    /// The buffer the next command is written into.
    pub(crate) fn out(&mut self) -> &mut Vec<u8> {
        &mut self.write
    }

    /// Whether written commands still wait for the socket.
    pub(crate) fn pending(&self) -> bool {
        self.written < self.write.len()
    }

    /// Writes what the socket takes now.
    pub(crate) fn flush(&mut self) -> Result<(), StoreError> {
        while self.written < self.write.len() {
            match self.stream.try_write(&self.write[self.written..]) {
                Ok(0) => return Err(closed()),
                Ok(n) => self.written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(io_error(e)),
            }
        }
        self.write.clear();
        self.written = 0;
        Ok(())
    }

    /// Reads what the socket has; `Ok(false)` if it had nothing after all.
    pub(crate) fn fill(&mut self) -> Result<bool, StoreError> {
        self.read.reserve(READ_CHUNK);
        match self.stream.try_read_buf(&mut self.read) {
            Ok(0) => Err(closed()),
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(io_error(e)),
        }
    }

    /// The next whole reply read, if any: its values go into `values` (an
    /// array's items, or the one value of any other reply).
    pub(crate) fn next_reply<T: Entry>(
        &mut self,
        values: &mut Vec<T>,
    ) -> Result<Option<Reply>, StoreError> {
        match parse(&self.read, values)? {
            Some((used, reply)) => {
                self.read.drain(..used);
                Ok(Some(reply))
            }
            None => Ok(None),
        }
    }

    /// Sends `hello` and checks its `replies` replies (all must succeed).
    async fn handshake(&mut self, hello: Vec<u8>, replies: usize) -> Result<(), StoreError> {
        self.write = hello;
        let mut values: Vec<Value> = Vec::new();
        let mut answered = 0;
        while answered < replies {
            if self.pending() {
                self.stream.writable().await.map_err(io_error)?;
                self.flush()?;
                continue;
            }
            self.stream.readable().await.map_err(io_error)?;
            if !self.fill()? {
                continue;
            }
            while let Some(reply) = self.next_reply(&mut values)? {
                if let Reply::Error(message) = reply {
                    return Err(response_error(message));
                }
                answered += 1;
            }
        }
        Ok(())
    }
}

/// One whole reply.
#[derive(Debug, PartialEq)]
pub(crate) enum Reply {
    /// Its values are in the caller's vector.
    Values,
    /// An error reply (`-CODE message`), without the `-`.
    Error(String),
}

/// One item of a reply, as a lane reads it: the charge script's replies are
/// numbers, and now and then a request's error message, so a number is kept
/// as it is (no general value to build and drop) and anything else boxed.
#[derive(Debug, PartialEq)]
pub(crate) enum Item {
    /// An integer.
    Int(i64),
    /// Any other value (a bulk or simple string, a null).
    Other(Box<Value>),
}

/// What a parsed reply's items are collected as, and read back as: redis-rs
/// values, or a lane's compact [`Item`]s.
pub(crate) trait Entry: Sized + std::fmt::Debug {
    /// An integer item.
    fn int(n: i64) -> Self;
    /// Any other item.
    fn other(v: Value) -> Self;
    /// The item as a number, if it is one.
    fn number(&self) -> Option<i64>;
    /// The item as text (a request's error message).
    fn text(&self) -> Option<String>;
}

impl Entry for Value {
    fn int(n: i64) -> Self {
        Value::Int(n)
    }

    fn other(v: Value) -> Self {
        v
    }

    fn number(&self) -> Option<i64> {
        match self {
            Value::Int(n) => Some(*n),
            _ => None,
        }
    }

    fn text(&self) -> Option<String> {
        redis::FromRedisValue::from_redis_value_ref(self).ok()
    }
}

impl Entry for Item {
    fn int(n: i64) -> Self {
        Item::Int(n)
    }

    fn other(v: Value) -> Self {
        Item::Other(Box::new(v))
    }

    fn number(&self) -> Option<i64> {
        match self {
            Item::Int(n) => Some(*n),
            Item::Other(_) => None,
        }
    }

    fn text(&self) -> Option<String> {
        match self {
            Item::Int(n) => Some(n.to_string()),
            Item::Other(v) => v.text(),
        }
    }
}

/// The store error for an error reply: its first word is the code.
pub(crate) fn response_error(message: String) -> StoreError {
    StoreError::Response {
        code: message.split_whitespace().next().map(str::to_owned),
        message,
    }
}

fn closed() -> StoreError {
    StoreError::Unavailable("redis connection failed: closed by the server".into())
}

/// The store error for a failed socket operation.
pub(crate) fn io_error(e: io::Error) -> StoreError {
    StoreError::Unavailable(format!("redis connection failed: {e}"))
}

fn protocol(why: &str) -> StoreError {
    StoreError::Protocol(format!("redis reply: {why}"))
}

/// The longest bulk string accepted (Redis' own limit is 512 MB; charge
/// replies carry short error messages only).
const MAX_BULK: usize = 64 << 20;

/// Parses one whole RESP2 reply at the start of `buf`: `Ok(None)` if it is
/// not all there yet, else the bytes it took and the reply. Arrays are flat
/// (the charge script never nests them); a nested one is a protocol error.
pub(crate) fn parse<T: Entry>(
    buf: &[u8],
    values: &mut Vec<T>,
) -> Result<Option<(usize, Reply)>, StoreError> {
    values.clear();
    let Some((head, mut at)) = line(buf, 0)? else {
        return Ok(None);
    };
    match buf[0] {
        b'-' => Ok(Some((
            at,
            Reply::Error(String::from_utf8_lossy(head).into_owned()),
        ))),
        b'*' => {
            // `*-1` is RESP2's null array; no other negative length is valid.
            let n = match number(head)? {
                -1 => 0,
                n if n < 0 => return Err(protocol("a negative array length")),
                n => n,
            };
            for _ in 0..n {
                match item(buf, at)? {
                    Some((v, next)) => {
                        values.push(v);
                        at = next;
                    }
                    None => return Ok(None),
                }
            }
            Ok(Some((at, Reply::Values)))
        }
        _ => Ok(item(buf, 0)?.map(|(v, next)| {
            values.push(v);
            (next, Reply::Values)
        })),
    }
}

/// The line starting at `at` without its type byte and CRLF, and where the
/// next one starts.
fn line(buf: &[u8], at: usize) -> Result<Option<(&[u8], usize)>, StoreError> {
    let Some(rest) = buf.get(at..).filter(|r| !r.is_empty()) else {
        return Ok(None);
    };
    let Some(nl) = rest.iter().position(|&b| b == b'\n') else {
        return Ok(None);
    };
    if nl < 2 || rest[nl - 1] != b'\r' {
        return Err(protocol("a line not ended by CRLF"));
    }
    Ok(Some((&rest[1..nl - 1], at + nl + 1)))
}

/// An integer line's (or a length's) digits, optionally after a sign (RESP
/// allows `+` or `-`), read as `str::parse` reads them. A charge reply is
/// mostly such numbers (five or more per request), so the usual case is
/// [`short_int`]; anything else (a `+`, 19 or more digits, a stray byte) goes
/// through `str::parse`, which checks for overflow.
fn number(digits: &[u8]) -> Result<i64, StoreError> {
    match short_int(digits) {
        Some((n, used)) if used == digits.len() => Ok(n),
        _ => std::str::from_utf8(digits)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| protocol("a malformed number")),
    }
}

/// The `[-]digits` at the start of `s`, read digit by digit, and the bytes
/// they take; `None` without a digit, or past 18 of them (up to 18 cannot
/// overflow an `i64`), for the caller's general path to answer.
fn short_int(s: &[u8]) -> Option<(i64, usize)> {
    let negative = s.first() == Some(&b'-');
    let start = usize::from(negative);
    let mut n: i64 = 0;
    let mut i = start;
    while let Some(&b) = s.get(i) {
        let d = b.wrapping_sub(b'0');
        if d > 9 {
            break;
        }
        if i - start == 18 {
            return None;
        }
        n = n * 10 + i64::from(d);
        i += 1;
    }
    (i > start).then_some((if negative { -n } else { n }, i))
}

/// An integer line (`:` then digits, CRLF) at `at`, read in one pass: the
/// digits as the line is scanned ([`short_int`]). Anything unusual (no
/// digits, 19 or more of them, a `+` sign, a byte other than CR after them)
/// is left to [`line`] and [`number`], which give the same answer as for any
/// other line.
fn int_line(buf: &[u8], at: usize) -> Option<(i64, usize)> {
    let rest = buf.get(at + 1..)?;
    let (n, i) = short_int(rest)?;
    (rest.get(i..i + 2) == Some(b"\r\n")).then_some((n, at + 1 + i + 2))
}

/// One array item (or a lone non-array reply) at `at`.
fn item<T: Entry>(buf: &[u8], at: usize) -> Result<Option<(T, usize)>, StoreError> {
    if buf.get(at) == Some(&b':') {
        if let Some((n, next)) = int_line(buf, at) {
            return Ok(Some((T::int(n), next)));
        }
    }
    let Some((head, next)) = line(buf, at)? else {
        return Ok(None);
    };
    let v = match buf[at] {
        b':' => return Ok(Some((T::int(number(head)?), next))),
        b'+' => Value::SimpleString(String::from_utf8_lossy(head).into_owned()),
        b'$' => {
            // `$-1` is RESP2's null bulk string; no other negative length is valid.
            let len = match number(head)? {
                -1 => return Ok(Some((T::other(Value::Nil), next))),
                n => usize::try_from(n).map_err(|_| protocol("a negative bulk length"))?,
            };
            if len > MAX_BULK {
                return Err(protocol("a bulk string over 64 MB"));
            }
            let Some(body) = buf.get(next..next + len + 2) else {
                return Ok(None);
            };
            if &body[len..] != b"\r\n" {
                return Err(protocol("a bulk string not ended by CRLF"));
            }
            return Ok(Some((
                T::other(Value::BulkString(body[..len].to_vec())),
                next + len + 2,
            )));
        }
        b'*' => return Err(protocol("a nested array")),
        b'-' => return Err(protocol("an error inside an array")),
        other => return Err(protocol(&format!("an unknown type byte {other:#04x}"))),
    };
    Ok(Some((T::other(v), next)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(buf: &[u8]) -> Result<Option<(usize, Reply, Vec<Value>)>, StoreError> {
        let mut values = vec![Value::Nil];
        Ok(parse(buf, &mut values)?.map(|(n, r)| (n, r, values)))
    }

    #[test]
    fn a_flat_array_of_integers_and_strings_parses_whole() {
        let buf = b"*4\r\n:3\r\n:-1\r\n$5\r\nOOM x\r\n$-1\r\n+OK\r\n";
        let (used, reply, values) = parsed(buf).unwrap().unwrap();
        assert_eq!(used, buf.len() - 5, "the next reply is left alone");
        assert_eq!(reply, Reply::Values);
        assert_eq!(
            values,
            vec![
                Value::Int(3),
                Value::Int(-1),
                Value::BulkString(b"OOM x".to_vec()),
                Value::Nil
            ]
        );
    }

    #[test]
    fn every_cut_short_reply_waits_for_more_bytes() {
        let buf = b"*3\r\n:12\r\n$3\r\nabc\r\n:7\r\n";
        for end in 0..buf.len() {
            assert!(
                parsed(&buf[..end]).unwrap().is_none(),
                "{:?} is not a whole reply",
                String::from_utf8_lossy(&buf[..end])
            );
        }
        assert!(parsed(buf).unwrap().is_some());
    }

    #[test]
    fn an_error_reply_keeps_its_code_and_message() {
        let (used, reply, _) = parsed(b"-NOSCRIPT No matching script.\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(used, 31);
        let Reply::Error(m) = reply else {
            panic!("not an error: {reply:?}")
        };
        let e = response_error(m);
        assert_eq!(e.kind(), "response");
        assert!(matches!(e, StoreError::Response { code: Some(c), .. } if c == "NOSCRIPT"));
        let Reply::Error(m) = parsed(b"-READONLY You can't write\r\n").unwrap().unwrap().1 else {
            panic!("not an error")
        };
        assert_eq!(response_error(m).kind(), "readonly");
    }

    #[test]
    fn malformed_replies_are_protocol_errors_not_panics() {
        for bad in [
            &b"*1\r\n*1\r\n:1\r\n"[..],
            b"*1\r\n-ERR x\r\n",
            b":12x\r\n",
            b":1\n",
            b"$3\r\nabcd\r\n",
            b"?\r\n",
            b"*1\r\n$99999999999\r\n",
            b"\r\n",
            b"*1\r\n\r\n",
        ] {
            let e = parsed(bad).unwrap_err();
            assert_eq!(e.kind(), "protocol", "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn numbers_read_as_str_parse_reads_them_and_anything_else_is_malformed() {
        for n in [
            0,
            7,
            -1,
            42,
            1_796_051_584_123,
            999_999_999_999_999_999,
            -999_999_999_999_999_999,
            1_000_000_000_000_000_000,
            i64::MAX,
            i64::MIN,
        ] {
            assert_eq!(number(n.to_string().as_bytes()).unwrap(), n, "{n}");
        }
        assert_eq!(number(b"-0").unwrap(), 0);
        assert_eq!(number(b"007").unwrap(), 7);
        assert_eq!(number(b"+5").unwrap(), 5);
        assert_eq!(number(b"+9223372036854775807").unwrap(), i64::MAX);
        for bad in [
            &b""[..],
            b"-",
            b"+",
            b"+-5",
            b"-+5",
            b"1-2",
            b"12x",
            b" 1",
            b"9223372036854775808",
            b"-9223372036854775809",
            b"99999999999999999999",
            "\u{661}".as_bytes(),
        ] {
            let e = number(bad).unwrap_err();
            assert_eq!(e.kind(), "protocol", "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn integer_items_read_in_one_pass_agree_with_the_general_reader() {
        // Whole, cut short anywhere, or malformed: the one-pass reader and
        // the general one (line, then number) give the same answer.
        let lines: [&[u8]; 14] = [
            b":+7\r\n",
            b":+\r\n",
            b":0\r\n",
            b":-1\r\n",
            b":1796051584123\r\n",
            b":999999999999999999\r\n",
            b":9223372036854775807\r\n",
            b":-9223372036854775808\r\n",
            b":9223372036854775808\r\n",
            b":\r\n",
            b":-\r\n",
            b":12x\r\n",
            b":12\n",
            b":12\r:",
        ];
        for l in lines {
            for end in 1..=l.len() {
                let buf = &l[..end];
                let general = line(buf, 0).and_then(|x| match x {
                    Some((head, next)) => Ok(Some((number(head)?, next))),
                    None => Ok(None),
                });
                let read = item(buf, 0).map(|x| {
                    x.map(|(v, next)| match v {
                        Value::Int(n) => (n, next),
                        other => panic!("{other:?}"),
                    })
                });
                match (&read, &general) {
                    (Ok(a), Ok(b)) => assert_eq!(a, b, "{:?}", String::from_utf8_lossy(buf)),
                    (Err(a), Err(b)) => assert_eq!(a.kind(), b.kind()),
                    _ => panic!(
                        "{:?}: {read:?} vs {general:?}",
                        String::from_utf8_lossy(buf)
                    ),
                }
            }
        }
        assert_eq!(item(b":42\r\n:7", 0).unwrap(), Some((Value::Int(42), 5)));
        assert_eq!(item(b"x:42\r\n", 1).unwrap(), Some((Value::Int(42), 6)));
    }

    #[test]
    fn an_empty_or_null_array_has_no_values() {
        assert_eq!(parsed(b"*0\r\n").unwrap().unwrap().2, vec![]);
        assert_eq!(parsed(b"*-1\r\n").unwrap().unwrap().2, vec![]);
    }

    #[test]
    fn only_minus_one_is_a_null_length_and_other_negatives_are_malformed() {
        assert_eq!(
            parsed(b"*1\r\n$-1\r\n").unwrap().unwrap().2,
            vec![Value::Nil]
        );
        for bad in [
            &b"*-2\r\n"[..],
            b"*-9223372036854775808\r\n",
            b"*1\r\n$-2\r\n",
            b"$-7\r\n",
        ] {
            let err = parsed(bad).expect_err(&String::from_utf8_lossy(bad));
            assert_eq!(err.kind(), "protocol", "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn only_plain_tcp_urls_get_their_own_socket() {
        let t = Duration::from_secs(1);
        let e = Endpoint::from_url("redis://u:p@127.0.0.1:7000/3", t, t).unwrap();
        assert_eq!((e.host.as_str(), e.port, e.db), ("127.0.0.1", 7000, 3));
        assert_eq!(e.username.as_deref(), Some("u"));
        assert_eq!(e.password.as_deref(), Some("p"));
        assert!(Endpoint::from_url("redis+unix:///tmp/redis.sock", t, t).is_none());
        assert!(Endpoint::from_url("not a url", t, t).is_none());
    }
}
