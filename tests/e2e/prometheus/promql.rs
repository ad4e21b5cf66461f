//! What the test reads in the rules and the dashboard: the metric names a
//! PromQL expression selects, the rule groups of the PrometheusRule, the
//! dashboard's queries with Grafana's variables filled in.

use std::collections::BTreeSet;

/// The metric names `expr` selects: every identifier that is not a function
/// or aggregation (followed by `(`), a keyword, a label list (`by (...)`,
/// `on (...)`, ...), a label matcher (`{...}`), a range (`[...]`), a string
/// or a number. Enough PromQL for our rules and dashboard; a name it missed
/// would only leave a metric unchecked, and the queries are run as well.
pub fn metric_names(expr: &str) -> BTreeSet<String> {
    const KEYWORDS: [&str; 9] = [
        "and", "or", "unless", "bool", "offset", "inf", "nan", "by", "without",
    ];
    const LABEL_LISTS: [&str; 6] = ["by", "without", "on", "ignoring", "group_left", "group_right"];
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' || c == '`' {
            i = skip_string(&chars, i);
        } else if c == '{' {
            i = skip_until(&chars, i, '}');
        } else if c == '[' {
            i = skip_until(&chars, i, ']');
        } else if c.is_ascii_digit() || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) {
            // A number or a duration (5m, 1e3, 0.99).
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut next = i;
            while next < chars.len() && chars[next].is_whitespace() {
                next += 1;
            }
            let rest: String = chars[next..].iter().take(16).collect();
            let modifier_follows = ["by", "without"].iter().any(|m| {
                rest.strip_prefix(m)
                    .is_some_and(|after| after.trim_start().starts_with('('))
            });
            if modifier_follows {
                // An aggregation written `sum by (labels) (expr)`.
            } else if chars.get(next) == Some(&'(') {
                if LABEL_LISTS.contains(&word.as_str()) {
                    i = skip_until(&chars, next, ')');
                }
                // Otherwise a function or an aggregation: its arguments follow.
            } else if !KEYWORDS.contains(&word.as_str()) && !LABEL_LISTS.contains(&word.as_str()) {
                names.insert(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

/// The index past the string starting at `start` (its quote), escapes included.
fn skip_string(chars: &[char], start: usize) -> usize {
    let quote = chars[start];
    let mut i = start + 1;
    while i < chars.len() && chars[i] != quote {
        i += if chars[i] == '\\' { 2 } else { 1 };
    }
    i + 1
}

/// The index past the first `close` after `start`, skipping strings.
fn skip_until(chars: &[char], start: usize, close: char) -> usize {
    let mut i = start + 1;
    while i < chars.len() && chars[i] != close {
        i = if chars[i] == '"' || chars[i] == '\'' {
            skip_string(chars, i)
        } else {
            i + 1
        };
    }
    i + 1
}

/// The PrometheusRule's groups as a Prometheus rules file: its `spec:`, the
/// last key of the document, dedented. (No YAML parser in the workspace;
/// the object's shape is fixed, and Prometheus refuses a file that is not
/// a rules file, so a wrong cut cannot pass unnoticed. The test also checks
/// that every alert of the file was loaded.)
pub fn rule_file(prometheusrule: &str) -> String {
    let (_, spec) = prometheusrule
        .split_once("\nspec:\n")
        .expect("the PrometheusRule has a top-level `spec:`");
    let mut out = String::new();
    for line in spec.lines() {
        assert!(
            line.is_empty() || line.starts_with("  "),
            "a top-level key after `spec:` in the PrometheusRule: {line:?}"
        );
        out.push_str(line.strip_prefix("  ").unwrap_or(line));
        out.push('\n');
    }
    out
}

/// A dashboard query as Grafana sends it for the test's stack: the
/// namespace variable and the rate interval filled in.
pub fn fill_variables(expr: &str, namespace: &str, rate_interval: &str) -> String {
    expr.replace("$namespace", namespace)
        .replace("${namespace}", namespace)
        .replace("$__rate_interval", rate_interval)
}

/// One query of the dashboard.
#[derive(Debug, Clone)]
pub struct PanelQuery {
    pub panel: String,
    pub expr: String,
}

/// Every query of every panel (rows' panels included), and the template
/// variables' `label_values(<selector>, <label>)` queries.
pub fn dashboard_queries(dashboard: &serde_json::Value) -> (Vec<PanelQuery>, Vec<(String, String, String)>) {
    fn walk(panels: &serde_json::Value, out: &mut Vec<PanelQuery>) {
        for panel in panels.as_array().into_iter().flatten() {
            for target in panel["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = target["expr"].as_str() {
                    out.push(PanelQuery {
                        panel: panel["title"].as_str().unwrap_or("?").to_owned(),
                        expr: expr.to_owned(),
                    });
                }
            }
            walk(&panel["panels"], out);
        }
    }
    let mut queries = Vec::new();
    walk(&dashboard["panels"], &mut queries);
    let mut variables = Vec::new();
    for variable in dashboard["templating"]["list"].as_array().into_iter().flatten() {
        let query = variable["query"]["query"]
            .as_str()
            .or_else(|| variable["query"].as_str())
            .unwrap_or("");
        if let Some(args) = query
            .strip_prefix("label_values(")
            .and_then(|q| q.strip_suffix(')'))
        {
            let (selector, label) = args.rsplit_once(',').expect("label_values(<selector>, <label>)");
            variables.push((
                variable["name"].as_str().unwrap_or("?").to_owned(),
                selector.trim().to_owned(),
                label.trim().to_owned(),
            ));
        }
    }
    (queries, variables)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(expr: &str) -> Vec<String> {
        metric_names(expr).into_iter().collect()
    }

    #[test]
    fn metric_names_leave_out_functions_labels_keywords_and_numbers() {
        assert_eq!(
            names(
                r#"max by (namespace) (outbox_pending) > 0
                   unless on (namespace)
                   sum by (namespace) (rate(outbox_dispatch_total{outcome="done", x=~"a|b}"}[10m])) > 0"#
            ),
            ["outbox_dispatch_total", "outbox_pending"]
        );
        assert_eq!(names(r#"absent(up{job="webhook-ingest-admin"} == 1)"#), ["up"]);
        assert_eq!(
            names(
                "histogram_quantile(0.99, sum by (le, kind) (rate(a_bucket[5m]))) / ignoring(kind) group_left b offset 1h"
            ),
            ["a_bucket", "b"]
        );
        assert_eq!(
            names("(sum(rate(c_total[1m])) or vector(0)) / time() - process_start_time_seconds * 1e3"),
            ["c_total", "process_start_time_seconds"]
        );
    }

    #[test]
    fn the_rule_file_is_the_spec_dedented() {
        let rule = "apiVersion: v1\nkind: PrometheusRule\nmetadata:\n  name: x\nspec:\n  groups:\n    - name: g\n      rules: []\n";
        assert_eq!(rule_file(rule), "groups:\n  - name: g\n    rules: []\n");
    }
}
