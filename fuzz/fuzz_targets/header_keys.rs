//! `Header` and `ApiKey` keys on arbitrary header values: they never panic,
//! a key is at most 48 bytes, distinct values give distinct keys, and a
//! secret never appears in its key or in an error message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tower_ratelimit::key::{ApiKey, Header, KeyExtractor};

fn parts(name: &'static str, value: &[u8]) -> Option<http::request::Parts> {
    let v = http::HeaderValue::from_bytes(value).ok()?;
    let mut req = http::Request::new(());
    req.headers_mut().insert(name, v);
    Some(req.into_parts().0)
}

fn check(extractor: &dyn KeyExtractor, name: &'static str, value: &[u8], secret: bool) -> Option<Vec<u8>> {
    let p = parts(name, value)?;
    match extractor.extract(&p) {
        Ok(Some(key)) => {
            let bytes = key.as_bytes().to_vec();
            assert!(bytes.len() <= 48);
            if secret && value.len() >= 8 {
                assert!(!bytes.windows(value.len()).any(|w| w == value), "a secret in its key");
            }
            Some(bytes)
        }
        Ok(None) => None,
        Err(e) => {
            let text = e.to_string();
            if secret && value.len() >= 4 {
                if let Ok(v) = std::str::from_utf8(value) {
                    let token = v.trim().trim_start_matches("Bearer ").trim();
                    // A token made of the messages' own words proves nothing.
                    let fixed = templates(extractor, name);
                    assert!(
                        token.len() < 4 || fixed.contains(token) || !text.contains(token),
                        "a secret in {text:?}"
                    );
                }
            }
            None
        }
    }
}

/// Every error message the extractor gives for inputs without a secret.
fn templates(extractor: &dyn KeyExtractor, name: &'static str) -> String {
    let mut all = String::new();
    let none = http::Request::new(()).into_parts().0;
    let inputs: [&[u8]; 4] = [b"Basic abc", b"Bearer", b"Bearer  ", b"\xff"];
    let found = std::iter::once(Some(none)).chain(inputs.iter().map(|v| parts(name, v)));
    for p in found.flatten() {
        if let Err(e) = extractor.extract(&p) {
            all.push_str(&e.to_string());
            all.push('\n');
        }
    }
    all
}

fuzz_target!(|input: (&[u8], &[u8])| {
    let (a, b) = input;
    let header = Header::try_new("x-tenant").unwrap();
    let api = ApiKey::header(http::HeaderName::from_static("x-api-key"));
    let bearer = ApiKey::bearer();
    // What each extractor keys by: a header's raw bytes, an API key's
    // trimmed value, a bearer credential's token.
    let raw = |v: &[u8]| v.to_vec();
    let trimmed = |v: &[u8]| v.trim_ascii().to_vec();
    let token = |v: &[u8]| {
        let v = v.trim_ascii();
        let at = v.iter().position(|b| matches!(b, b' ' | b'\t')).unwrap_or(v.len());
        v[at..].trim_ascii().to_vec()
    };
    let kinds: [(&dyn KeyExtractor, &'static str, bool, &dyn Fn(&[u8]) -> Vec<u8>); 3] = [
        (&header, "x-tenant", false, &raw),
        (&api, "x-api-key", true, &trimmed),
        (&bearer, "authorization", true, &token),
    ];
    for (x, name, secret, keyed_by) in kinds {
        let ka = check(x, name, a, secret);
        let kb = check(x, name, b, secret);
        if let (Some(ka), Some(kb)) = (ka, kb) {
            assert_eq!(ka == kb, keyed_by(a) == keyed_by(b), "{name}: keys and values disagree");
        }
    }
});
