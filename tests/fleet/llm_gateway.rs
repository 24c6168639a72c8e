//! The LLM gateway example, run as a black box over TCP: a completion
//! reserves an estimate from its prompt and is settled to the tokens it
//! streamed, below or above the estimate.

use crate::support::example;
use crate::support::http as http_support;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use http_support::HttpClient;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// POSTs `prompt` as alice, asking for at most `max_tokens`: the status,
/// the `ratelimit` field and the streamed body.
async fn complete(
    server: &example::Running,
    prompt: &str,
    max_tokens: u64,
) -> (StatusCode, String, String) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let req = Request::post(server.url("/v1/completions"))
        .header("x-api-key", "alice")
        .header("x-max-tokens", max_tokens.to_string())
        .body(Full::new(Bytes::from(prompt.to_owned())))
        .unwrap();
    let res = client.request(req).await.unwrap();
    let status = res.status();
    let field = res
        .headers()
        .get("ratelimit")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (status, field, String::from_utf8(body.to_vec()).unwrap())
}

async fn tokens_left(server: &example::Running, client: &HttpClient) -> String {
    let r = client
        .get_with(&server.url("/v1/usage"), &[("x-api-key", b"alice")])
        .await;
    assert_eq!(r.status, StatusCode::OK);
    r.body
        .lines()
        .find(|l| l.starts_with("tokens:"))
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn a_completion_reserves_an_estimate_and_settles_the_tokens_it_streamed() {
    let server = example::Running::start(
        "llm_gateway",
        &["--addr", "127.0.0.1:0", "--tokens-per-minute", "100"],
    );
    let client = HttpClient::new();

    // 5 prompt words (9 bytes: 3 estimated) and up to 20 more: 23 reserved.
    let (status, field, body) = complete(&server, "a b c d e", 20).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, "e d c b a e d c b a ");
    assert!(field.contains(r#""tokens";r=77;"#), "{field}");
    // Used 5 + 10: the rest of the reservation came back.
    assert_eq!(
        tokens_left(&server, &client).await,
        "tokens: 85 of 100 tokens left"
    );

    // 40 words (79 bytes: 20 estimated) and 1 more: 21 reserved, 41 used.
    let long = vec!["w"; 40].join(" ");
    let (status, _, body) = complete(&server, &long, 1).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "w "));
    assert_eq!(
        tokens_left(&server, &client).await,
        "tokens: 44 of 100 tokens left"
    );

    // Admitted while 44 are left; its 150 tokens go into debt.
    let fifty = vec!["x"; 50].join(" ");
    let (status, _, body) = complete(&server, &fifty, 100).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body.split_whitespace().count(), 100);
    assert_eq!(
        tokens_left(&server, &client).await,
        "tokens: 0 of 100 tokens left"
    );

    let (status, _, body) = complete(&server, "one more", 1).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(body.contains(r#""violated-policies":["tokens"]"#), "{body}");
}
