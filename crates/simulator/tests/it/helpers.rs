//! `spawn()`: a downstream in process on port 0, and a client for it.

use reqwest::header::HeaderMap;
use simulator::downstream::{self, DownstreamConfig, Faults, RunningDownstream};

pub struct TestDownstream {
    pub url: String,
    pub http: reqwest::Client,
    pub running: RunningDownstream,
}

/// The answer, whole.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: bytes::Bytes,
}

impl Answer {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }

    pub fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }
}

pub fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

pub async fn spawn() -> TestDownstream {
    spawn_with(DownstreamConfig::default()).await
}

pub async fn spawn_faulty(faults: Faults) -> TestDownstream {
    spawn_with(DownstreamConfig {
        faults,
        ..DownstreamConfig::default()
    })
    .await
}

pub async fn spawn_with(config: DownstreamConfig) -> TestDownstream {
    let running = downstream::spawn(config).await.expect("starting the downstream");
    TestDownstream {
        url: running.url(),
        http: client(),
        running,
    }
}

pub fn shipment(order_id: i64) -> String {
    format!(r#"{{"order_id":{order_id},"event_id":"evt_{order_id}"}}"#)
}

pub fn email(order_id: i64, template: &str) -> String {
    format!(r#"{{"order_id":{order_id},"template":"{template}","event_id":"evt_{order_id}"}}"#)
}

impl TestDownstream {
    /// A POST with a key (if any) and a traceparent.
    pub async fn try_post(&self, path: &str, key: Option<&str>, body: &str) -> reqwest::Result<Answer> {
        let mut request = self
            .http
            .post(format!("{}{path}", self.url))
            .header("content-type", "application/json")
            .header(
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            )
            .body(body.to_owned());
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        let response = request.send().await?;
        Ok(Answer {
            status: response.status().as_u16(),
            headers: response.headers().clone(),
            body: response.bytes().await?,
        })
    }

    pub async fn post(&self, path: &str, key: &str, body: &str) -> Answer {
        self.try_post(path, Some(key), body).await.expect("an answer")
    }

    pub async fn control(&self, path: &str, body: &str) -> Answer {
        let response = self
            .http
            .post(format!("{}{path}", self.url))
            .body(body.to_owned())
            .send()
            .await
            .expect("an answer");
        Answer {
            status: response.status().as_u16(),
            headers: response.headers().clone(),
            body: response.bytes().await.unwrap(),
        }
    }

    pub async fn get_json(&self, path: &str) -> serde_json::Value {
        self.http
            .get(format!("{}{path}", self.url))
            .send()
            .await
            .unwrap()
            .error_for_status()
            .unwrap()
            .json()
            .await
            .unwrap()
    }
}
