//! The concurrency limiter's response body.

use super::limiter::Slot;
use crate::guarded_body::GuardedBody;

/// The inner service's body holding the request's [`Slot`] until it has been
/// sent (last frame, error, or drop on a client disconnect), or the limiter's
/// own 429.
pub type ResponseBody<B> = GuardedBody<B, Slot>;
