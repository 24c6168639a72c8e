//! The load shedder's response body.

use super::shedder::Admission;
use crate::guarded_body::GuardedBody;

/// The inner service's body holding the request's [`Admission`] (it counts
/// in flight) until it has been sent, or the shedder's own 503.
pub type ResponseBody<B> = GuardedBody<B, Admission>;
