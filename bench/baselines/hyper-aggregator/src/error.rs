//! Failures and their JSON rendering — the same status codes, `code` strings and body shape as
//! fanout (`{"error": {"code", "message", "step", "backend"}}`), so error paths cost the same.

use crate::Body;
use bytes::Bytes;
use http::header::{ALLOW, CONTENT_TYPE};
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::Full;

/// Why a request failed.
#[derive(Debug)]
pub(crate) struct Error {
    status: StatusCode,
    code: &'static str,
    message: String,
    /// The flow step concerned (fanout's step names: `found`, `details`, `mask`, `price`, …).
    step: Option<&'static str>,
    /// The backend concerned.
    backend: Option<&'static str>,
    /// `Allow` header value for 405.
    allow: Option<&'static str>,
}

impl Error {
    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Error {
            status,
            code,
            message: message.into(),
            step: None,
            backend: None,
            allow: None,
        }
    }

    /// A failed backend call of `step`.
    pub(crate) fn call(
        status: StatusCode,
        code: &'static str,
        step: &'static str,
        backend: &'static str,
        message: String,
    ) -> Self {
        Error {
            step: Some(step),
            backend: Some(backend),
            ..Error::new(status, code, message)
        }
    }

    /// 405 for a known path with the wrong method.
    pub(crate) fn method_not_allowed<B>(req: &Request<B>, allow: &'static str) -> Self {
        Error {
            allow: Some(allow),
            ..Error::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                format!(
                    "{} is not allowed on {}; allowed: {allow}",
                    req.method(),
                    req.uri().path()
                ),
            )
        }
    }

    /// A request body that is not what the route expects.
    pub(crate) fn bad_body(code: &'static str, message: impl Into<String>) -> Self {
        Error::new(StatusCode::BAD_REQUEST, code, message)
    }

    pub(crate) fn into_response(self) -> Response<Body> {
        let body = serde_json::json!({
            "error": {
                "code": self.code,
                "message": self.message,
                "step": self.step,
                "backend": self.backend,
            }
        });
        let mut resp = Response::new(Full::new(Bytes::from(body.to_string())));
        *resp.status_mut() = self.status;
        let h = resp.headers_mut();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(allow) = self.allow {
            h.insert(ALLOW, HeaderValue::from_static(allow));
        }
        resp
    }
}
