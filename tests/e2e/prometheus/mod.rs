//! The alerts and the dashboard, proven on a real Prometheus.
//!
//! `promtool test rules` (deploy-check) proves each alert on series written
//! by hand; this proves them on the series the binaries really export. A
//! Prometheus server (Debian's, scripts/prometheus.sh) scrapes the live
//! ingest's and relay's admin ports every second, with the job names and
//! target labels the ServiceMonitors give them, and evaluates the rule groups
//! of deploy/components/monitoring/prometheusrule.yaml every second. A short
//! load goes through the ingest while the downstream fails every call
//! (retried with back-off) and refuses three confirmations with 422 (dead at
//! once). Then, through Prometheus's HTTP API:
//!
//! - every alerting rule was loaded and evaluates without error; the alerts
//!   this situation must raise are active (OutboxRelayNotDelivering: rows
//!   wait and nothing is delivered; OutboxDeadRows), and no other is;
//! - every metric name the rules and the dashboard select is in the scrape;
//! - every query of the dashboard (deploy/components/monitoring/dashboard.json),
//!   with its variables filled in, returns data, and its namespace variable
//!   offers the stack's namespace;
//! - the build, process and pool metrics come from both services.
//!
//! The rules' `for:` (5 and 10 minutes) is longer than this test is allowed
//! to run, so an alert whose expression holds is `pending`, not `firing`:
//! "active" here is either, as in `ALERTS{alertstate=~"pending|firing"}`.
//! That is the part a live Prometheus adds; how long each alert waits before
//! it fires is promtool's to test, on a simulated clock.

mod promql;
mod server;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use simulator::downstream::{Faults, ScriptStep};

use self::server::{Prometheus, Target};
use crate::harness::{Stack, StackOptions, event};

/// The target label the ServiceMonitors' targets carry, and the dashboard's
/// `$namespace`.
const NAMESPACE: &str = "webhooks";
/// The dashboard's `$__rate_interval`, as Grafana would set it for a
/// 1 s scrape interval on a short range: several scrapes.
const RATE_INTERVAL: &str = "15s";
/// Orders paid by the load: a ship_order and a send_confirmation each.
const ORDERS: i64 = 30;
/// The first orders' confirmations, refused with 422: dead at once.
const DEAD: i64 = 3;
/// The alerts the situation raises.
const EXPECTED: [&str; 2] = ["OutboxRelayNotDelivering", "OutboxDeadRows"];

#[tokio::test]
async fn the_alerts_and_the_dashboard_hold_on_a_real_prometheus() {
    let started = Instant::now();
    let tools = server::tools();
    let monitoring = testkit::workspace_root().join("deploy/components/monitoring");
    let prometheus_rule = std::fs::read_to_string(monitoring.join("prometheusrule.yaml")).unwrap();
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(monitoring.join("dashboard.json")).unwrap())
            .expect("dashboard.json is JSON");

    let stack = Stack::start(StackOptions {
        // A prune every second (nothing is old enough to delete): its runs
        // are on the dashboard.
        relay_env: vec![("RELAY_PRUNE_INTERVAL_SECS", "1".into())],
        ..Default::default()
    })
    .await;
    stack
        .downstream
        .set_faults(Faults {
            error_rate: 1.0,
            ..Faults::default()
        })
        .unwrap();
    for order in 1..=DEAD {
        stack
            .downstream
            .script(&format!("conf-{order}"), [ScriptStep::Status(422)]);
    }
    for order in 1..=ORDERS {
        stack.insert_order(order, &format!("pay_{order}")).await;
    }
    let prometheus = Prometheus::start(
        &tools,
        NAMESPACE,
        &[
            Target {
                job: "webhook-ingest-admin",
                admin: &stack.ingest_admin,
                pod: "webhook-ingest-0",
            },
            Target {
                job: "outbox-relay-admin",
                admin: &stack.relay_admin,
                pod: "outbox-relay-0",
            },
        ],
        &promql::rule_file(&prometheus_rule),
    )
    .await;
    // Prometheus syncs its targets at most every 5 s: the first scrapes
    // come a few seconds after it is ready.
    wait_for_scrapes(&prometheus, 1).await;

    drive_load(&stack).await;

    // The relay's database gauges refresh every 5 s, the rules run every
    // second: the expected alerts are active within seconds (check_alerts
    // says which are not, if they are not within 30).
    let waiting = Instant::now();
    while waiting.elapsed() < Duration::from_secs(30) {
        let active = prometheus.active_alerts().await;
        if EXPECTED.iter().all(|name| active.iter().any(|(n, _)| n == name)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // Enough scrapes in the dashboard's rate interval for every rate().
    wait_for_scrapes(&prometheus, 5).await;

    let mut problems = Vec::new();
    problems.extend(check_alerts(&prometheus, &prometheus_rule).await);
    problems.extend(check_metric_names(&prometheus, &dashboard).await);
    problems.extend(check_dashboard_queries(&prometheus, &dashboard).await);
    problems.extend(check_common_metrics(&prometheus).await);
    assert!(
        problems.is_empty(),
        "{} problems:\n  - {}",
        problems.len(),
        problems.join("\n  - ")
    );
    eprintln!("prometheus: rules and dashboard held in {:?}", started.elapsed());
}

/// Waits until both services have been scraped at least `n` times within
/// the last RATE_INTERVAL.
async fn wait_for_scrapes(prometheus: &Prometheus, n: u32) {
    let started = Instant::now();
    loop {
        let counts = prometheus
            .query(&format!(
                "count_over_time(up{{namespace=\"{NAMESPACE}\"}}[{RATE_INTERVAL}])"
            ))
            .await
            .unwrap_or_default();
        let scraped = counts.len() == 2
            && counts
                .iter()
                .all(|s| s["value"][1].as_str().and_then(|v| v.parse::<u32>().ok()) >= Some(n));
        if scraped {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "not scraped {n} times: {counts:?}\nprometheus log:\n{}",
            prometheus.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Payments for every order, some delivered twice, a few with a signature
/// made with another secret (under the signature alert's half), a few for
/// no order; over about three seconds, so that the rates have several
/// scrapes to span.
async fn drive_load(stack: &Stack) {
    for order in 1..=ORDERS {
        let body = event(
            &format!("evt_{order}"),
            "payment.succeeded",
            &format!("pay_{order}"),
        );
        assert_eq!(stack.post(&body, &[]).await.status(), 200);
        if order % 5 == 0 {
            assert_eq!(stack.post(&body, &[]).await.status(), 200, "a duplicate");
        }
        if order % 10 == 0 {
            let forged = event(&format!("evt_forged_{order}"), "payment.succeeded", "pay_1");
            let status = stack
                .post_signed_with(&forged, "whsec_QUJDREVGR0hJSktMTU5PUA==", &[])
                .await
                .status();
            assert_eq!(status, 401);
        }
        if order % 15 == 0 {
            let stray = event(&format!("evt_stray_{order}"), "payment.succeeded", "pay_nobody");
            assert_eq!(stack.post(&stray, &[]).await.status(), 200, "unmatched");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every alert of the file loaded and evaluated without error; the expected
/// ones active (pending within their `for:`, or firing), the others inactive.
async fn check_alerts(prometheus: &Prometheus, prometheus_rule: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let in_file = prometheus_rule
        .lines()
        .filter(|l| l.trim_start().starts_with("- alert:"))
        .count();
    let rules = prometheus.alerting_rules().await;
    if rules.len() != in_file {
        problems.push(format!(
            "{} alerting rules loaded, {in_file} in prometheusrule.yaml",
            rules.len()
        ));
    }
    for rule in &rules {
        if rule.health != "ok" {
            problems.push(format!(
                "alert {}: health {} {}",
                rule.name, rule.health, rule.last_error
            ));
        }
        let expected = EXPECTED.contains(&rule.name.as_str());
        let active = rule.state == "pending" || rule.state == "firing";
        if expected && !active {
            problems.push(format!("alert {} should be active, is {}", rule.name, rule.state));
        }
        if !expected && active {
            problems.push(format!(
                "alert {} should be inactive, is {}: {}",
                rule.name, rule.state, rule.query
            ));
        }
    }
    // The same, as the series Grafana and Alertmanager see.
    match prometheus.query(r#"ALERTS{alertstate=~"pending|firing"}"#).await {
        Ok(series) => {
            let names: BTreeSet<&str> = series
                .iter()
                .filter_map(|s| s["metric"]["alertname"].as_str())
                .collect();
            if names != EXPECTED.into_iter().collect() {
                problems.push(format!("ALERTS has {names:?}, expected {EXPECTED:?}"));
            }
        }
        Err(e) => problems.push(format!("ALERTS: {e}")),
    }
    problems
}

/// Every metric the loaded rules and the dashboard select is one Prometheus
/// scraped.
async fn check_metric_names(prometheus: &Prometheus, dashboard: &serde_json::Value) -> Vec<String> {
    let scraped: BTreeSet<String> = prometheus.metric_names().await.into_iter().collect();
    let mut uses: Vec<(String, String)> = Vec::new();
    for rule in prometheus.alerting_rules().await {
        uses.extend(
            promql::metric_names(&rule.query)
                .into_iter()
                .map(|m| (m, format!("alert {}", rule.name))),
        );
    }
    let (queries, _) = promql::dashboard_queries(dashboard);
    for q in &queries {
        uses.extend(
            promql::metric_names(&q.expr)
                .into_iter()
                .map(|m| (m, format!("panel {:?}", q.panel))),
        );
    }
    let mut problems = Vec::new();
    for (metric, user) in uses {
        if !scraped.contains(&metric) {
            problems.push(format!("{user} uses `{metric}`, which no service exports"));
        }
    }
    problems
}

/// Every query of the dashboard returns something, and the namespace
/// variable offers the stack's namespace.
async fn check_dashboard_queries(prometheus: &Prometheus, dashboard: &serde_json::Value) -> Vec<String> {
    let (queries, variables) = promql::dashboard_queries(dashboard);
    let mut problems = Vec::new();
    if queries.is_empty() {
        problems.push("the dashboard has no query".to_owned());
    }
    for q in &queries {
        let expr = promql::fill_variables(&q.expr, NAMESPACE, RATE_INTERVAL);
        match prometheus.query(&expr).await {
            Ok(result) if result.is_empty() => {
                problems.push(format!("panel {:?}: no data for {expr}", q.panel));
            }
            Ok(_) => {}
            Err(e) => problems.push(format!("panel {:?}: {expr}: {e}", q.panel)),
        }
    }
    // What the "Dead rows" panels show is what the database holds.
    let dead = prometheus
        .query(&format!(r#"max(outbox_dead{{namespace="{NAMESPACE}"}})"#))
        .await
        .unwrap_or_default();
    let shown = dead
        .first()
        .and_then(|s| s["value"][1].as_str())
        .unwrap_or("none");
    if shown != DEAD.to_string() {
        problems.push(format!("outbox_dead reads {shown}, {DEAD} rows are dead"));
    }
    for (name, selector, label) in variables {
        let series = prometheus.api("series", &[("match[]", selector.as_str())]).await;
        let offered = series
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s[label.as_str()] == NAMESPACE);
        if !offered {
            problems.push(format!(
                "variable {name}: label_values({selector}, {label}) does not offer {NAMESPACE}"
            ));
        }
    }
    problems
}

/// The build, process and pool metrics, from both services.
async fn check_common_metrics(prometheus: &Prometheus) -> Vec<String> {
    let mut problems = Vec::new();
    let jobs: BTreeSet<&str> = ["webhook-ingest-admin", "outbox-relay-admin"].into();
    for metric in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
        "db_pool_connections",
        "db_pool_max_connections",
        "db_pool_waiters",
    ] {
        let result = prometheus
            .query(&format!("count by (job) ({metric})"))
            .await
            .unwrap_or_default();
        let from: BTreeSet<&str> = result
            .iter()
            .filter_map(|s| s["metric"]["job"].as_str())
            .collect();
        if from != jobs {
            problems.push(format!("{metric} comes from {from:?}, not from both services"));
        }
    }
    for (metric, job) in [
        ("webhook_ingest_build_info", "webhook-ingest-admin"),
        ("outbox_relay_build_info", "outbox-relay-admin"),
    ] {
        let result = prometheus
            .query(&format!("{metric} == 1"))
            .await
            .unwrap_or_default();
        let ok = result.len() == 1
            && result[0]["metric"]["job"] == job
            && result[0]["metric"]["version"] == env!("CARGO_PKG_VERSION");
        if !ok {
            problems.push(format!(
                "{metric}: expected one series of {job} at version {}, got {result:?}",
                env!("CARGO_PKG_VERSION")
            ));
        }
    }
    problems
}
