//! Log lines of the code under test, captured for assertions: a `tracing`
//! subscriber that writes plain text into a buffer, for this thread (a
//! current-thread runtime's tasks included) while the guard lives.
#![allow(dead_code)]

use std::io;
use std::sync::{Arc, Mutex};
use tracing::subscriber::DefaultGuard;

/// What the subscriber wrote.
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Captures every event at every level on this thread until the guard drops.
pub fn capture() -> (Captured, DefaultGuard) {
    // With a single live dispatcher, tracing decides a callsite's interest
    // from the default of whichever thread reaches it first: a test on
    // another thread, with no subscriber, would cache "never" for every
    // callsite it reaches first and this capture would miss their events.
    // A second dispatcher, kept for the process, makes tracing ask every
    // dispatcher instead.
    static SECOND: std::sync::OnceLock<tracing::Dispatch> = std::sync::OnceLock::new();
    SECOND.get_or_init(|| tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default()));
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::TRACE)
        .finish();
    (captured, tracing::subscriber::set_default(subscriber))
}
