//! Every way a delivery can fail, and what the provider is told.
//!
//! The policy, in one place:
//! - The client gets a stable JSON body `{"error": "..."}` whose text is
//!   safe to show (no secrets, no SQL, no internal detail), and a status the
//!   provider acts on: 4xx means "do not retry this as is", 503 means "retry
//!   later" (with `Retry-After`), 500 means a bug, also retried.
//! - The log gets the whole cause chain (see `http::receive`).
//! - The metrics get a fixed `outcome` label (docs/CONTRACT.md, section 8).

use actix_web::HttpResponse;
use actix_web::http::StatusCode;

/// The most a webhook body may weigh: 256 KiB, checked on `Content-Length`
/// and on the bytes actually read.
pub const MAX_BODY_BYTES: usize = 256 * 1024;

/// Seconds a provider should wait after a 503.
const RETRY_AFTER_SECS: &str = "1";

#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("body larger than {MAX_BODY_BYTES} bytes")]
    TooLarge,
    #[error("invalid signature: {0}")]
    Signature(#[from] signature::VerifyError),
    #[error("not an event: {0}")]
    Malformed(#[from] domain::EventError),
    #[error("could not read the body: {0}")]
    BodyRead(String),
    #[error("database unavailable: {0}")]
    Unavailable(String),
    #[error("deadline exceeded")]
    Deadline,
    #[error("the body did not arrive within half the deadline")]
    SlowBody,
    #[error("too many requests in flight")]
    Overloaded,
    #[error(transparent)]
    Unexpected(#[from] anyhow::Error),
}

impl IngestError {
    pub fn status(&self) -> StatusCode {
        match self {
            Self::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Signature(_) => StatusCode::UNAUTHORIZED,
            Self::Malformed(_) | Self::BodyRead(_) => StatusCode::BAD_REQUEST,
            Self::Unavailable(_) | Self::Deadline | Self::SlowBody | Self::Overloaded => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Self::Unexpected(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The `outcome` label of `webhook_requests_total`.
    pub fn outcome(&self) -> &'static str {
        match self {
            Self::TooLarge => "too_large",
            Self::Signature(_) => "invalid_signature",
            Self::Malformed(_) | Self::BodyRead(_) => "malformed",
            Self::Unavailable(_) | Self::Deadline | Self::SlowBody => "unavailable",
            // Its own label: a capacity problem (scale out, or raise
            // INGEST_MAX_IN_FLIGHT), where `unavailable` is the database's.
            Self::Overloaded => "shed",
            Self::Unexpected(_) => "internal_error",
        }
    }

    /// What the provider reads.
    fn public_message(&self) -> String {
        match self {
            Self::Unavailable(_) | Self::Deadline | Self::SlowBody | Self::Overloaded => {
                "temporarily unavailable, retry later".into()
            }
            Self::Unexpected(_) => "internal error".into(),
            other => other.to_string(),
        }
    }

    pub fn response(&self) -> HttpResponse {
        let mut response = HttpResponse::build(self.status());
        if self.status() == StatusCode::SERVICE_UNAVAILABLE {
            response.insert_header(("Retry-After", RETRY_AFTER_SECS));
        }
        response.json(serde_json::json!({ "error": self.public_message() }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_labels() {
        let cases: Vec<(IngestError, u16, &str)> = vec![
            (IngestError::TooLarge, 413, "too_large"),
            (
                signature::VerifyError::NoMatchingSignature.into(),
                401,
                "invalid_signature",
            ),
            (domain::EventError::MissingId.into(), 400, "malformed"),
            (IngestError::BodyRead("reset".into()), 400, "malformed"),
            (IngestError::Unavailable("down".into()), 503, "unavailable"),
            (IngestError::Deadline, 503, "unavailable"),
            (IngestError::SlowBody, 503, "unavailable"),
            (IngestError::Overloaded, 503, "shed"),
            (anyhow::anyhow!("bug").into(), 500, "internal_error"),
        ];
        for (err, status, label) in cases {
            assert_eq!(err.status().as_u16(), status, "{err}");
            assert_eq!(err.outcome(), label, "{err}");
            let response = err.response();
            assert_eq!(
                response.headers().contains_key("retry-after"),
                status == 503,
                "{err}"
            );
        }
    }

    #[test]
    fn internals_are_not_shown() {
        let err: IngestError = anyhow::anyhow!("relation \"secret_table\" does not exist").into();
        assert_eq!(err.public_message(), "internal error");
        let err = IngestError::Unavailable("connection refused to 10.0.0.5".into());
        assert!(!err.public_message().contains("10.0.0.5"));
    }
}
