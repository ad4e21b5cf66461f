//! Prometheus text exposition, parsed for assertions.

/// One sample: name, labels, value.
pub type Sample = (String, Vec<(String, String)>, f64);

/// Prometheus text, parsed: `name{labels}` -> value.
#[derive(Debug)]
pub struct Metrics {
    pub samples: Vec<Sample>,
}

impl Metrics {
    /// `{admin}/metrics` (`admin`: `http://host:port`), fetched and parsed.
    pub async fn fetch(http: &reqwest::Client, admin: &str) -> reqwest::Result<Self> {
        let text = http.get(format!("{admin}/metrics")).send().await?.text().await?;
        Ok(Self::parse(&text))
    }

    /// Parses the exposition format strictly enough that a malformed line fails the test.
    pub fn parse(text: &str) -> Self {
        let mut samples = Vec::new();
        for line in text.lines() {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (series, value) = line
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("malformed line {line:?}"));
            let value: f64 = match value {
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                v => v.parse().unwrap_or_else(|_| panic!("bad value in {line:?}")),
            };
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => {
                    let rest = rest
                        .strip_suffix('}')
                        .unwrap_or_else(|| panic!("unclosed labels in {line:?}"));
                    let labels = rest
                        .split(',')
                        .filter(|l| !l.is_empty())
                        .map(|l| {
                            let (k, v) = l
                                .split_once('=')
                                .unwrap_or_else(|| panic!("bad label in {line:?}"));
                            (k.to_owned(), v.trim_matches('"').to_owned())
                        })
                        .collect();
                    (name.to_owned(), labels)
                }
                None => (series.to_owned(), Vec::new()),
            };
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
                "bad metric name in {line:?}"
            );
            samples.push((name, labels, value));
        }
        Self { samples }
    }

    /// The sample of `name` with exactly these labels, if the series exists.
    pub fn find(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.samples
            .iter()
            .find(|(n, l, _)| {
                n == name
                    && l.len() == labels.len()
                    && labels
                        .iter()
                        .all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v))
            })
            .map(|(_, _, v)| *v)
    }

    /// The value of `name` with exactly these labels (others absent), or 0.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|(n, l, _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v))
                    && l.iter().filter(|(k, _)| k != "le").count() == labels.len()
            })
            .map(|(_, _, v)| *v)
            .sum()
    }

    pub fn has(&self, name: &str) -> bool {
        self.samples.iter().any(|(n, _, _)| n == name)
    }
}
