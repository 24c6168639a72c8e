//! The reply parsers, reachable by the fuzz targets (`fuzz/`, built with
//! `--cfg fuzzing`); not part of the API.

use super::batch::{self, Job};
use super::keys::HashKey;
use crate::decision::Decision;
use crate::error::StoreError;
use crate::store::slots::Occupancy;
use crate::Policy;
use redis::Value;
use std::time::Duration;

/// A charge batch's reply (`packed` numbers, then error messages) read
/// for requests of `(policy, now, cost)`.
pub fn charge_reply(
    packed: Vec<u8>,
    messages: Vec<Vec<u8>>,
    requests: &[(Policy, Option<u64>, u64)],
) -> Result<Vec<Result<Decision, StoreError>>, StoreError> {
    let jobs: Vec<Job> = requests
        .iter()
        .map(|(policy, now, cost)| Job {
            hash_key: HashKey::from_slice(b"k"),
            policy: policy.clone(),
            now: *now,
            cost: *cost,
            units: *cost,
            wait_ms: 0,
            timeout: Duration::from_secs(1),
        })
        .collect();
    let mut reply = vec![Value::BulkString(packed)];
    reply.extend(messages.into_iter().map(Value::BulkString));
    batch::answers(&reply, &jobs)
}

/// A status script's reply.
pub fn status_reply(
    policy: &Policy,
    sent_now: Option<u64>,
    reply: &[i64],
) -> Result<Decision, StoreError> {
    super::reply::decode(policy, None, sent_now, reply)
}

/// A concurrency acquire script's reply to a call sent at `sent`.
pub fn acquire_reply(sent: u64, reply: &[i64]) -> Result<Occupancy, StoreError> {
    super::concurrency::decode(sent, reply)
}
