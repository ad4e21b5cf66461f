//! A real Prometheus server (Debian's, extracted by scripts/prometheus.sh)
//! scraping the stack's admin ports on loopback every second and evaluating
//! a rules file every second; its HTTP API, for the test's questions.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The folder holding `prometheus` and `promtool`, provided the first time
/// (a download of Debian's package, then reused from target/).
pub fn tools() -> PathBuf {
    let out = Command::new(testkit::workspace_root().join("scripts/prometheus.sh"))
        .stderr(Stdio::inherit())
        .output()
        .expect("running scripts/prometheus.sh");
    assert!(out.status.success(), "scripts/prometheus.sh failed");
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// A scrape job: the name the ServiceMonitor gives it (the Service's name),
/// the admin URL, and the labels the operator's target would carry.
pub struct Target<'a> {
    pub job: &'a str,
    pub admin: &'a str,
    pub pod: &'a str,
}

/// A Prometheus process, killed on drop; its folder (config, rules, TSDB,
/// log) removed with it.
pub struct Prometheus {
    child: Child,
    dir: PathBuf,
    pub url: String,
    http: reqwest::Client,
}

impl Prometheus {
    /// Starts it scraping `targets` (labelled `namespace`) and evaluating
    /// `rules` (a rules file's text), and waits until it is ready.
    pub async fn start(tools: &Path, namespace: &str, targets: &[Target<'_>], rules: &str) -> Self {
        let port = testkit::free_port();
        let dir = std::env::temp_dir().join(format!("e2e-prometheus-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("rules.yaml"), rules).unwrap();
        let mut config = String::from(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - rules.yaml\nscrape_configs:\n",
        );
        for target in targets {
            let host = target.admin.trim_start_matches("http://");
            config.push_str(&format!(
                "  - job_name: {job}\n    static_configs:\n      - targets: ['{host}']\n        \
                 labels: {{namespace: {namespace}, pod: {pod}, service: {job}}}\n",
                job = target.job,
                pod = target.pod,
            ));
        }
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new(tools.join("prometheus"))
            .current_dir(&dir)
            .args([
                "--config.file=prometheus.yml".to_owned(),
                format!("--storage.tsdb.path={}", dir.join("data").display()),
                format!("--web.listen-address=127.0.0.1:{port}"),
                "--log.level=warn".to_owned(),
            ])
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("starting prometheus");
        let prometheus = Self {
            child,
            dir,
            url: format!("http://127.0.0.1:{port}"),
            http: testkit::http(),
        };
        let started = Instant::now();
        loop {
            if let Ok(r) = prometheus
                .http
                .get(format!("{}/-/ready", prometheus.url))
                .send()
                .await
                && r.status() == 200
            {
                return prometheus;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "prometheus never became ready:\n{}",
                prometheus.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    fn api_url(&self, path: &str, query: &[(&str, &str)]) -> reqwest::Url {
        reqwest::Url::parse_with_params(&format!("{}/api/v1/{path}", self.url), query).unwrap()
    }

    /// `GET /api/v1/<path>`'s `data`, with the query parameters given.
    pub async fn api(&self, path: &str, query: &[(&str, &str)]) -> Value {
        let response: Value = self
            .http
            .get(self.api_url(path, query))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(response["status"], "success", "{path} {query:?}: {response}");
        response["data"].clone()
    }

    /// An instant query's result: the vector's samples (or a scalar as one).
    pub async fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        let response: Value = self
            .http
            .get(self.api_url("query", &[("query", expr)]))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if response["status"] != "success" {
            return Err(format!("{}: {}", response["errorType"], response["error"]));
        }
        let data = &response["data"];
        Ok(match data["resultType"].as_str() {
            Some("scalar" | "string") => vec![data["result"].clone()],
            _ => data["result"].as_array().cloned().unwrap_or_default(),
        })
    }

    /// The names of every metric it has ingested.
    pub async fn metric_names(&self) -> Vec<String> {
        self.api("label/__name__/values", &[])
            .await
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect()
    }

    /// Alert name -> its state (`pending` or `firing`), as the rule manager
    /// holds them (`/api/v1/alerts`; `ALERTS` is the same as a series).
    pub async fn active_alerts(&self) -> Vec<(String, String)> {
        let data = self.api("alerts", &[]).await;
        data["alerts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                (
                    a["labels"]["alertname"].as_str().unwrap().to_owned(),
                    a["state"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    }

    /// Every alerting rule loaded: (name, query, state, health, last error).
    pub async fn alerting_rules(&self) -> Vec<Rule> {
        let data = self.api("rules", &[("type", "alert")]).await;
        let mut rules = Vec::new();
        for group in data["groups"].as_array().unwrap() {
            for rule in group["rules"].as_array().unwrap() {
                rules.push(Rule {
                    name: rule["name"].as_str().unwrap().to_owned(),
                    query: rule["query"].as_str().unwrap().to_owned(),
                    state: rule["state"].as_str().unwrap().to_owned(),
                    health: rule["health"].as_str().unwrap().to_owned(),
                    last_error: rule["lastError"].as_str().unwrap_or("").to_owned(),
                });
            }
        }
        rules
    }
}

#[derive(Debug, Clone)]
pub struct Rule {
    pub name: String,
    pub query: String,
    /// inactive, pending or firing.
    pub state: String,
    /// ok, err or unknown (not evaluated yet).
    pub health: String,
    pub last_error: String,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
