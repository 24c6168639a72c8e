//! What every test binary shares, included once by each of them:
//!
//! ```ignore
//! #[path = "../support/mod.rs"]
//! mod support;
//! ```
//!
//! Real processes and real sockets: `redis-server`, `redis-sentinel` and
//! TLS servers on free loopback ports, axum servers and hyper clients over
//! TCP, the built examples run as black boxes. What a binary shares by
//! being one process is here too: the metrics recorder, installed once.
//! `fleet.rs` (a simulated fleet) is not declared here: `tests/fleet` and
//! the `simulate` tool (`tools/src/bin/simulate.rs`) include it by path.
#![allow(dead_code)]

pub mod admin;
pub mod example;
pub mod http;
pub mod labels;
pub mod logs;
pub mod managed;
pub mod poll;
pub mod recorder;
pub mod redis;
pub mod shed;
pub mod vectors;
