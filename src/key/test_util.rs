//! Request heads for the unit tests.

use http::request::{Builder, Parts};
use http::HeaderValue;
use std::net::SocketAddr;

pub(crate) struct Req(Builder);

pub(crate) fn request() -> Req {
    Req(http::Request::builder())
}

impl Req {
    pub(crate) fn uri(self, uri: &str) -> Self {
        Req(self.0.uri(uri))
    }

    pub(crate) fn method(self, method: &str) -> Self {
        Req(self.0.method(method))
    }

    /// Raw bytes, so tests can send values that are not UTF-8.
    pub(crate) fn header(self, name: &str, value: impl AsRef<[u8]>) -> Self {
        Req(self
            .0
            .header(name, HeaderValue::from_bytes(value.as_ref()).unwrap()))
    }

    /// The TCP peer as hyper-based servers record it (`"192.0.2.1:1234"`).
    pub(crate) fn peer(self, addr: &str) -> Self {
        self.extension(addr.parse::<SocketAddr>().unwrap())
    }

    pub(crate) fn extension<T: Clone + Send + Sync + 'static>(self, value: T) -> Self {
        Req(self.0.extension(value))
    }

    pub(crate) fn parts(self) -> Parts {
        self.0.body(()).unwrap().into_parts().0
    }
}
