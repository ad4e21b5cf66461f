//! docs/openapi.yaml, the contract integrators read, against the code.
//!
//! - Without a server: the document names every path the services route,
//!   every status the webhook handler can answer with its exact error text and
//!   headers, every `status` of a 200, both schemes' signature headers and the
//!   limits ([`the_document_names_what_the_code_answers`]).
//! - Against the real binaries: schemathesis (from PyPI, pinned in
//!   scripts/schemathesis-requirements.txt, installed on first use into
//!   target/schemathesis-venv) generates requests from the document, and
//!   scripts/schemathesis_hooks.py signs most of them with the ingest's secret
//!   (and sends the rest unsigned, badly signed or too large). Every answer
//!   must be documented: its status, content type, headers and body, and no
//!   5xx while the database is up. The ingest in both signature schemes, with
//!   its database down (the 503s), and the relay's admin endpoints.
//!
//! Without Python (no `python3`, or no `venv` module) the tests say so and
//! pass, unless `CI` is set: then they fail. `OPENAPI_SEED` picks another
//! seed than the fixed one (schemathesis prints the seed of a failing run).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use actix_web::http::StatusCode;
use domain::{EventError, EventOutcome, MAX_ID_LEN};
use signature::VerifyError;
use testkit::{Role, TestDb};
use webhook_ingest::error::{IngestError, MAX_BODY_BYTES};
use webhook_ingest::http::{REPLAYED_HEADER, WEBHOOK_PATH};

use crate::helpers::{SECRET, STRIPE_SECRET};

mod schemathesis;

use self::schemathesis::Schemathesis;

const DOCUMENT: &str = "docs/openapi.yaml";

#[tokio::test]
async fn the_document_names_what_the_code_answers() {
    let Some(st) = Schemathesis::provide() else {
        return;
    };
    let doc = st.document();
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(doc["info"]["version"], env!("CARGO_PKG_VERSION"));

    paths_and_methods_are_the_served_ones(&doc);
    let post = &doc["paths"][WEBHOOK_PATH]["post"];
    let responses = post["responses"].as_object().unwrap();
    every_error_is_documented(&doc, responses).await;
    the_401_texts_are_the_verifiers(responses);
    the_200_lists_every_outcome_and_the_replay_header(&doc, responses);
    the_request_headers_and_limits_are_documented(&doc, post);
}

fn paths_and_methods_are_the_served_ones(doc: &serde_json::Value) {
    // The console's pages (tag `console`) are another binary's, held by
    // tests/e2e/console/guards.rs against the console.
    let console = |item: &serde_json::Value| {
        item.as_object().unwrap().values().any(|op| {
            op["tags"]
                .as_array()
                .is_some_and(|t| t.iter().any(|t| t == "console"))
        })
    };
    let routes: BTreeMap<&str, Vec<&str>> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, item)| !console(item))
        .map(|(path, item)| {
            let methods = item
                .as_object()
                .unwrap()
                .keys()
                .map(String::as_str)
                .filter(|k| !["servers", "parameters", "summary", "description"].contains(k))
                .collect();
            (path.as_str(), methods)
        })
        .collect();
    let served: BTreeMap<&str, Vec<&str>> = [
        (WEBHOOK_PATH, vec!["post"]),
        ("/healthz", vec!["get"]),
        ("/readyz", vec!["get"]),
        ("/metrics", vec!["get"]),
    ]
    .into();
    assert_eq!(
        routes, served,
        "paths and methods: documented (left), served (right)"
    );
}

type Responses = serde_json::Map<String, serde_json::Value>;

/// Every error the handler can answer: its status, content type, header and
/// exact text are documented, and no other status is.
async fn every_error_is_documented(doc: &serde_json::Value, responses: &Responses) {
    let mut statuses = BTreeSet::from([StatusCode::OK.as_u16().to_string()]);
    for error in every_error() {
        let response = error.response();
        let status = response.status().as_u16().to_string();
        let documented = responses
            .get(&status)
            .unwrap_or_else(|| panic!("{status} ({error}) is not documented"));
        let content_type = response
            .headers()
            .get("content-type")
            .unwrap()
            .to_str()
            .unwrap()
            .to_owned();
        assert!(
            documented["content"][&content_type].is_object(),
            "{status} ({error}): {content_type} not documented"
        );
        match response.headers().get("retry-after") {
            Some(value) => {
                let header = resolve(doc, &documented["headers"]["Retry-After"]);
                assert_eq!(header["required"], true, "{status}: Retry-After");
                assert_eq!(
                    header["schema"]["const"].to_string(),
                    value.to_str().unwrap(),
                    "{status}: Retry-After"
                );
            }
            None => assert!(
                documented["headers"]["Retry-After"].is_null(),
                "{status} ({error}) has no Retry-After"
            ),
        }
        let body = actix_web::body::to_bytes(response.into_body()).await.unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let text = body["error"].as_str().unwrap();
        assert_eq!(
            body,
            serde_json::json!({ "error": text }),
            "{status}: the body is `error` alone"
        );
        let schema = &documented["content"][&content_type]["schema"]["allOf"][1]["properties"]["error"];
        if let Some(exact) = schema.get("const") {
            assert_eq!(exact, text, "{status}");
        } else if let Some(choices) = schema.get("enum") {
            assert!(
                choices.as_array().unwrap().iter().any(|c| c == text),
                "{status}: {text:?} is not in the documented enum"
            );
        } else {
            // A pattern naming each kind of message by what precedes its colon.
            let pattern = schema["pattern"].as_str().unwrap();
            let (kind, _) = text.split_once(": ").unwrap();
            assert!(pattern.contains(kind), "{status}: {text:?} not in {pattern}");
        }
        statuses.insert(status);
    }
    let documented: BTreeSet<String> = responses.keys().cloned().collect();
    assert_eq!(
        documented, statuses,
        "statuses: documented (left), answered (right)"
    );
}

/// Each 401 text the document lists is one the verifier gives.
fn the_401_texts_are_the_verifiers(responses: &Responses) {
    let unauthorized: BTreeSet<String> = every_verify_error()
        .into_iter()
        .map(|e| IngestError::from(e).to_string())
        .collect();
    let listed: BTreeSet<String> =
        responses["401"]["content"]["application/json"]["schema"]["allOf"][1]["properties"]["error"]["enum"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e.as_str().unwrap().to_owned())
            .collect();
    assert_eq!(
        listed, unauthorized,
        "401 texts: documented (left), given (right)"
    );
}

/// A 200: every outcome, and the replay's header.
fn the_200_lists_every_outcome_and_the_replay_header(doc: &serde_json::Value, responses: &Responses) {
    let result = resolve(doc, &responses["200"]["content"]["application/json"]["schema"]);
    let outcomes: BTreeSet<&str> = result["properties"]["status"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    assert_eq!(
        outcomes,
        EventOutcome::ANSWERS.iter().map(|o| o.as_str()).collect(),
        "200 statuses: documented (left), the domain's (right)"
    );
    let replayed = resolve(doc, &responses["200"]["headers"][REPLAYED_HEADER]);
    assert_eq!(replayed["schema"]["const"], "true", "{REPLAYED_HEADER}");
}

/// The request: both schemes' headers, and the limits.
fn the_request_headers_and_limits_are_documented(doc: &serde_json::Value, post: &serde_json::Value) {
    let headers: BTreeSet<String> = post["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| resolve(doc, p))
        .filter(|p| p["in"] == "header")
        .map(|p| p["name"].as_str().unwrap().to_ascii_lowercase())
        .collect();
    let read: BTreeSet<String> = [
        signature::HEADER_ID,
        signature::HEADER_TIMESTAMP,
        signature::HEADER_SIGNATURE,
        signature::HEADER_STRIPE,
        "traceparent",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    assert_eq!(headers, read, "request headers: documented (left), read (right)");
    let event = &doc["components"]["schemas"]["ProviderEvent"];
    for field in ["id", "type"] {
        assert_eq!(event["properties"][field]["maxLength"], MAX_ID_LEN, "{field}");
    }
    assert!(
        post["requestBody"]["description"]
            .as_str()
            .unwrap()
            .contains(&MAX_BODY_BYTES.to_string()),
        "the request body's limit"
    );
}

/// Every error the webhook handler answers with, each kind at least once.
fn every_error() -> Vec<IngestError> {
    let errors: Vec<IngestError> = [
        IngestError::TooLarge,
        IngestError::BodyRead("connection reset".into()),
        IngestError::Unavailable("connection refused".into()),
        IngestError::Deadline,
        IngestError::SlowBody,
        IngestError::Overloaded,
        IngestError::Unexpected(anyhow::anyhow!("a bug")),
    ]
    .into_iter()
    .chain(every_verify_error().into_iter().map(IngestError::from))
    .chain(every_event_error().into_iter().map(IngestError::from))
    .collect();
    for error in &errors {
        // A new kind of error is a compile error here until it is listed above.
        match error {
            IngestError::TooLarge
            | IngestError::Signature(_)
            | IngestError::Malformed(_)
            | IngestError::BodyRead(_)
            | IngestError::Unavailable(_)
            | IngestError::Deadline
            | IngestError::SlowBody
            | IngestError::Overloaded
            | IngestError::Unexpected(_) => {}
        }
    }
    errors
}

/// Every reason the verifier gives, for each header it reads.
fn every_verify_error() -> Vec<VerifyError> {
    let headers = [
        signature::HEADER_ID,
        signature::HEADER_TIMESTAMP,
        signature::HEADER_SIGNATURE,
        signature::HEADER_STRIPE,
    ];
    let errors: Vec<VerifyError> = headers
        .into_iter()
        .flat_map(|h| [VerifyError::MissingHeader(h), VerifyError::MalformedHeader(h)])
        .chain([
            VerifyError::TimestampOutOfTolerance,
            VerifyError::NoMatchingSignature,
        ])
        .collect();
    for error in &errors {
        match error {
            VerifyError::MissingHeader(_)
            | VerifyError::MalformedHeader(_)
            | VerifyError::TimestampOutOfTolerance
            | VerifyError::NoMatchingSignature => {}
        }
    }
    errors
}

fn every_event_error() -> Vec<EventError> {
    let errors = vec![
        EventError::NotJson("expected value at line 1 column 1".into()),
        EventError::MissingId,
        EventError::MissingType,
        EventError::TooLong { field: "id" },
        EventError::Empty { field: "type" },
        EventError::NulCharacter,
        EventError::LoneSurrogate("d800".into()),
        EventError::NumberOutOfRange("1e200000".into()),
        EventError::TooDeep,
    ];
    for error in &errors {
        match error {
            EventError::NotJson(_)
            | EventError::MissingId
            | EventError::MissingType
            | EventError::TooLong { .. }
            | EventError::Empty { .. }
            | EventError::NulCharacter
            | EventError::LoneSurrogate(_)
            | EventError::NumberOutOfRange(_)
            | EventError::TooDeep => {}
        }
    }
    errors
}

/// `value`, or what its `$ref` (`#/components/...`) points to.
fn resolve<'a>(doc: &'a serde_json::Value, value: &'a serde_json::Value) -> &'a serde_json::Value {
    match value["$ref"].as_str() {
        Some(reference) => {
            let pointer = reference
                .strip_prefix('#')
                .expect("a reference inside the document");
            doc.pointer(pointer)
                .unwrap_or_else(|| panic!("{reference} is not in the document"))
        }
        None => value,
    }
}
