//! Keys from what the request asks for: its method, path or matched route.

use super::{Key, KeyError, KeyExtractor};
use http::request::Parts;

/// Keys by the HTTP method (`GET`, `POST`, …); combine with a client key.
///
/// ```
/// use tower_ratelimit::key::{ClientIp, KeyExtractorExt, Method};
/// // Each client gets separate budgets for reads and writes.
/// let per_client_method = ClientIp::new().and(Method);
/// # let _ = per_client_method;
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Method;

impl KeyExtractor for Method {
    fn extract(&self, parts: &Parts) -> Result<Option<Key>, KeyError> {
        Ok(Some(Key::new(parts.method.as_str())))
    }
}

/// Keys by the URI path, without the query.
///
/// The path is chosen by the client: alone, it lets a client spread requests
/// over endlessly many keys (`/a`, `/a/`, `/a/.`, …) and lets one client
/// exhaust a path for everyone. Combine it with a client key
/// (`ClientIp::new().and(Path)`), and prefer `MatchedRoute` (feature `axum`),
/// whose route templates are a fixed set.
///
/// ```
/// use tower_ratelimit::key::{ClientIp, KeyExtractorExt, Path};
/// let per_client_path = ClientIp::new().and(Path);
/// # let _ = per_client_path;
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Path;

impl KeyExtractor for Path {
    fn extract(&self, parts: &Parts) -> Result<Option<Key>, KeyError> {
        Ok(Some(Key::new(parts.uri.path())))
    }
}

/// Keys by the gRPC method: the path `/package.Service/Method`.
///
/// For per-method limits (combine with a client key: `(ClientIp::new(), GrpcMethod)`)
/// and per-method quotas (see `RateLimitLayerBuilder::policy_fn`). The path is
/// chosen by the client, so a request whose path is not of the gRPC form is a
/// [`KeyError`] rather than a fresh key per invented path.
///
/// ```
/// use tower_ratelimit::key::{GrpcMethod, KeyExtractor};
/// let (parts, ()) = http::Request::post("/grpc.health.v1.Health/Check").body(()).unwrap().into_parts();
/// assert!(GrpcMethod.extract(&parts).unwrap().is_some());
/// let (parts, ()) = http::Request::get("/a/b/c").body(()).unwrap().into_parts();
/// assert!(GrpcMethod.extract(&parts).is_err());
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct GrpcMethod;

impl KeyExtractor for GrpcMethod {
    fn extract(&self, parts: &Parts) -> Result<Option<Key>, KeyError> {
        let path = parts.uri.path();
        let well_formed = path
            .strip_prefix('/')
            .and_then(|p| p.split_once('/'))
            .is_some_and(|(service, method)| {
                !service.is_empty() && !method.is_empty() && !method.contains('/')
            });
        if well_formed {
            Ok(Some(Key::new(path)))
        } else {
            Err(KeyError::client(
                "grpc_method",
                "the path is not a gRPC method (`/package.Service/Method`)",
            ))
        }
    }
}

/// Keys by axum's matched route template (`/users/{id}`), from its `MatchedPath` extension.
///
/// axum records the route only for middleware inside the router: add the rate
/// limiter with `Router::layer` or `Router::route_layer`. A request no route
/// matched (the router's fallback, which `Router::layer` also wraps) is
/// keyed as one route, [`MatchedRoute::UNMATCHED`]: every unmatched path is
/// limited together, keeps its `404`, and a scanner cannot buy a fresh quota
/// per invented path. (Around the whole router no request carries a route,
/// so every request would count as unmatched: keep the layer inside.)
///
/// ```
/// use tower_ratelimit::key::{ClientIp, KeyExtractorExt, MatchedRoute};
/// let per_client_route = ClientIp::new().and(MatchedRoute);
/// # let _ = per_client_route;
/// ```
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MatchedRoute;

#[cfg(feature = "axum")]
impl MatchedRoute {
    /// The route every request that no route matched is keyed as. A route
    /// template starts with `/`, so no route's key equals it.
    pub const UNMATCHED: &'static str = "(unmatched)";
}

#[cfg(feature = "axum")]
impl KeyExtractor for MatchedRoute {
    fn extract(&self, parts: &Parts) -> Result<Option<Key>, KeyError> {
        let route = parts
            .extensions
            .get::<axum::extract::MatchedPath>()
            .map_or(Self::UNMATCHED, |path| path.as_str());
        Ok(Some(Key::new(route)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::test_util::request;

    #[test]
    fn method_key_is_the_method_name() {
        let post = request().method("POST").parts();
        assert_eq!(Method.extract(&post), Ok(Some(Key::new("POST"))));
        let get = request().method("GET").parts();
        assert_ne!(Method.extract(&get), Method.extract(&post));
    }

    #[test]
    fn path_key_is_the_path_without_query() {
        let parts = request().uri("http://h/a/b?x=1").parts();
        assert_eq!(Path.extract(&parts), Ok(Some(Key::new("/a/b"))));
    }

    #[test]
    fn path_of_60_kib_gives_a_bounded_key() {
        // http caps a URI just below 64 KiB.
        let long = format!("/{}", "a".repeat(60 * 1024));
        let parts = request().uri(&long).parts();
        let key = Path.extract(&parts).unwrap().unwrap();
        assert_eq!(key, Key::new(&long));
        assert!(key.as_bytes().len() <= 48);
    }

    #[cfg(feature = "axum")]
    #[test]
    fn a_request_without_a_matched_route_is_keyed_as_the_one_unmatched_route() {
        let key = MatchedRoute.extract(&request().uri("/nope").parts());
        assert_eq!(key, Ok(Some(Key::new(MatchedRoute::UNMATCHED))));
        let other = MatchedRoute.extract(&request().uri("/also-nope").parts());
        assert_eq!(key, other, "every unmatched path is limited together");
    }

    #[cfg(feature = "axum")]
    #[tokio::test]
    async fn matched_route_key_is_the_route_template() {
        use axum::extract::Request;
        use axum::middleware::{from_fn, Next};
        use axum::routing::get;
        use axum::Router;
        use std::sync::{Arc, Mutex};
        use tower::ServiceExt;

        // MatchedPath cannot be built outside axum: route a request to get one.
        let seen = Arc::new(Mutex::new(None));
        let record = seen.clone();
        let app: Router = Router::new()
            .route("/users/{id}", get(|| async {}))
            .layer(from_fn(move |req: Request, next: Next| {
                let (parts, body) = req.into_parts();
                *record.lock().unwrap() = Some(MatchedRoute.extract(&parts));
                next.run(Request::from_parts(parts, body))
            }));
        let req = Request::get("/users/42")
            .body(axum::body::Body::empty())
            .unwrap();
        app.oneshot(req).await.unwrap();
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen, Some(Ok(Some(Key::new("/users/{id}")))));
    }
}
