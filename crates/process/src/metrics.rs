//! The metrics every service exports besides its own (docs/CONTRACT.md,
//! section 8), registered by [`register`]:
//!
//! - `<service>_build_info`: 1, labelled with the release (`version`) and,
//!   when the build was told it, the source revision (`revision`).
//! - `process_*`: the process's CPU, memory, file descriptors and start time,
//!   under the names every Prometheus client library uses, so that the
//!   dashboards and alerts written for those work unchanged.
//! - `db_pool_*`: the connection pool: connections open by state, the most
//!   it may hold, callers waiting for one.
//!
//! Each is read when `/metrics` is scraped (a collector, not a gauge kept up
//! to date): a few reads of `/proc/self` and of the pool's counters, nothing
//! on any request's path.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

/// The source revision the build was given (`SOURCE_REVISION=<git sha>` in
/// the build's environment: deploy/Dockerfile's build argument), if any. No
/// build script asks git: the image build has no `.git`, and a revision read
/// behind cargo's back would be stale as often as not.
pub const SOURCE_REVISION: Option<&str> = option_env!("SOURCE_REVISION");

/// Registers the build, process and pool metrics of the service whose build
/// metric is `build_info` (e.g. `webhook_ingest_build_info`), at `version`
/// (its `CARGO_PKG_VERSION`), with `pool` its connection pool.
pub fn register(registry: &mut Registry, build_info: &'static str, version: &'static str, pool: &db::Pool) {
    registry.register_collector(Box::new(BuildInfo {
        name: build_info,
        version,
        revision: SOURCE_REVISION.filter(|r| !r.is_empty()),
    }));
    registry.register_collector(Box::new(ProcessCollector));
    registry.register_collector(Box::new(PoolCollector { pool: pool.clone() }));
}

/// `<service>_build_info 1`, labelled with what this binary is.
#[derive(Debug)]
struct BuildInfo {
    name: &'static str,
    version: &'static str,
    revision: Option<&'static str>,
}

impl Collector for BuildInfo {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut labels = vec![("version", self.version)];
        if let Some(revision) = self.revision {
            labels.push(("revision", revision));
        }
        let mut metric = encoder.encode_descriptor(
            self.name,
            "Always 1; the labels say which build this is",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(1_i64).encode(metric.encode_family(&labels)?)
    }
}

/// The connection pool, as it is when scraped.
#[derive(Debug)]
struct PoolCollector {
    pool: db::Pool,
}

impl Collector for PoolCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let status = self.pool.status();
        let in_use = status.open.saturating_sub(status.idle);
        {
            let mut family = encoder.encode_descriptor(
                "db_pool_connections",
                "Database connections open in the pool, by state: idle (free to check out) or in_use",
                None,
                MetricType::Gauge,
            )?;
            for (state, n) in [("idle", status.idle), ("in_use", in_use)] {
                ConstGauge::new(n as i64).encode(family.encode_family(&[("state", state)])?)?;
            }
        }
        gauge(
            &mut encoder,
            "db_pool_max_connections",
            "The most connections the pool may hold (DATABASE_POOL_SIZE)",
            status.max as i64,
        )?;
        gauge(
            &mut encoder,
            "db_pool_waiters",
            "Callers waiting for a connection: every one in use and no other may be opened",
            status.waiting as i64,
        )
    }
}

fn gauge<N: prometheus_client::encoding::EncodeGaugeValue>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: N,
) -> Result<(), std::fmt::Error> {
    ConstGauge::new(value).encode(encoder.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

/// `process_*` from `/proc/self` (Linux; elsewhere none). What cannot be
/// read is left out of the scrape rather than failing it.
#[derive(Debug)]
struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(sample) = proc::sample() else {
            return Ok(());
        };
        if let Some(cpu) = sample.cpu_seconds {
            ConstCounter::new(cpu).encode(encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                None,
                MetricType::Counter,
            )?)?;
        }
        let gauges = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                sample.resident_bytes,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                sample.virtual_bytes,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                sample.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors (the soft limit)",
                sample.max_fds,
            ),
        ];
        for (name, help, value) in gauges {
            if let Some(value) = value {
                gauge(&mut encoder, name, help, value as f64)?;
            }
        }
        if let Some(start) = sample.start_time_seconds {
            gauge(
                &mut encoder,
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                start,
            )?;
        }
        Ok(())
    }
}

/// Reading `/proc`: the parsing is plain functions of the files' text, so
/// that it is tested on fixed inputs as well as on this process.
mod proc {
    /// Clock ticks per second of the times in `/proc/<pid>/stat`: USER_HZ,
    /// 100 on every architecture Linux runs these services on. (Reading it
    /// with sysconf would take unsafe code; the Prometheus Go client's
    /// procfs makes the same assumption.)
    const USER_HZ: f64 = 100.0;

    #[derive(Debug, Default, PartialEq)]
    pub struct Sample {
        pub cpu_seconds: Option<f64>,
        pub resident_bytes: Option<u64>,
        pub virtual_bytes: Option<u64>,
        pub open_fds: Option<u64>,
        pub max_fds: Option<u64>,
        pub start_time_seconds: Option<f64>,
    }

    #[cfg(target_os = "linux")]
    pub fn sample() -> Option<Sample> {
        let read = |path: &str| std::fs::read_to_string(path).ok();
        let stat = read("/proc/self/stat")?;
        let times = stat_times(&stat);
        let status = read("/proc/self/status").unwrap_or_default();
        let boot_time = read("/proc/stat").as_deref().and_then(boot_time);
        Some(Sample {
            cpu_seconds: times.map(|t| t.cpu_seconds),
            resident_bytes: status_kib(&status, "VmRSS:").map(|k| k * 1024),
            virtual_bytes: times.map(|t| t.virtual_bytes),
            open_fds: std::fs::read_dir("/proc/self/fd")
                .ok()
                .map(|entries| entries.count() as u64),
            max_fds: read("/proc/self/limits").as_deref().and_then(max_open_files),
            start_time_seconds: times.zip(boot_time).map(|(t, boot)| boot + t.started_after_boot),
        })
    }

    #[cfg(not(target_os = "linux"))]
    pub fn sample() -> Option<Sample> {
        None
    }

    #[derive(Debug, Clone, Copy, PartialEq)]
    pub struct StatTimes {
        pub cpu_seconds: f64,
        pub started_after_boot: f64,
        pub virtual_bytes: u64,
    }

    /// utime + stime, starttime and vsize from `/proc/<pid>/stat`. The fields
    /// are counted after the command name's closing parenthesis, as the name
    /// may itself hold spaces and parentheses.
    pub fn stat_times(stat: &str) -> Option<StatTimes> {
        let (_, after_name) = stat.rsplit_once(')')?;
        // after_name's first field is the 3rd of the line (state).
        let fields: Vec<&str> = after_name.split_whitespace().collect();
        let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
        let (utime, stime) = (field(14)?, field(15)?);
        Some(StatTimes {
            cpu_seconds: (utime + stime) as f64 / USER_HZ,
            started_after_boot: field(22)? as f64 / USER_HZ,
            virtual_bytes: field(23)?,
        })
    }

    /// A `Key:   1234 kB` line of `/proc/<pid>/status`, in KiB.
    pub fn status_kib(status: &str, key: &str) -> Option<u64> {
        status
            .lines()
            .find_map(|line| line.strip_prefix(key))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    }

    /// `btime` of `/proc/stat`: when the machine booted, in seconds since the epoch.
    pub fn boot_time(stat: &str) -> Option<f64> {
        stat.lines()
            .find_map(|line| line.strip_prefix("btime "))?
            .trim()
            .parse()
            .ok()
    }

    /// The soft limit on open files in `/proc/<pid>/limits` (none if unlimited).
    pub fn max_open_files(limits: &str) -> Option<u64> {
        limits
            .lines()
            .find_map(|line| line.strip_prefix("Max open files"))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn stat_fields_are_counted_after_the_name_whatever_it_holds() {
            // A name with a space and a parenthesis, as a thread may be named.
            let stat = "4242 (web hook) x) S 1 4242 4242 0 -1 4194560 1234 0 0 0 \
                        250 75 0 0 20 0 9 0 123456 987654321 2048 18446744073709551615";
            assert_eq!(
                stat_times(stat),
                Some(StatTimes {
                    cpu_seconds: 3.25,
                    started_after_boot: 1234.56,
                    virtual_bytes: 987_654_321,
                })
            );
            assert_eq!(stat_times("4242 (truncated) S 1 2"), None);
        }

        #[test]
        fn status_limits_and_boot_time() {
            let status = "Name:\tingest\nVmPeak:\t  200000 kB\nVmSize:\t  150000 kB\nVmRSS:\t   20480 kB\n";
            assert_eq!(status_kib(status, "VmRSS:"), Some(20_480));
            assert_eq!(status_kib(status, "VmSwap:"), None);
            let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                          Max processes             95000                95000                processes\n\
                          Max open files            1024                 524288               files\n";
            assert_eq!(max_open_files(limits), Some(1024));
            assert_eq!(
                max_open_files("Max open files            unlimited            unlimited            files\n"),
                None
            );
            assert_eq!(
                boot_time("cpu  1 2 3\nbtime 1700000000\nprocesses 9\n"),
                Some(1.7e9)
            );
        }

        /// This process, read for real: plausible values for each.
        #[cfg(target_os = "linux")]
        #[test]
        fn this_process() {
            let sample = sample().expect("/proc/self is readable");
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("after the epoch")
                .as_secs_f64();
            let started = sample.start_time_seconds.expect("start time");
            assert!(
                started <= now + 1.0 && started > now - 3600.0,
                "{started} vs {now}"
            );
            assert!(sample.cpu_seconds.expect("cpu") >= 0.0);
            let resident = sample.resident_bytes.expect("rss");
            assert!(resident > 1024 * 1024, "{resident}");
            assert!(sample.virtual_bytes.expect("vsize") >= resident);
            let open = sample.open_fds.expect("open fds");
            assert!(open >= 3, "{open}");
            if let Some(max) = sample.max_fds {
                assert!(max >= open, "{max} < {open}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape(registry: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).expect("encodes");
        text
    }

    #[test]
    fn build_info_is_one_labelled_with_the_version() {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(BuildInfo {
            name: "webhook_ingest_build_info",
            version: "1.2.3",
            revision: Some("0123abc"),
        }));
        let text = scrape(&registry);
        assert!(
            text.contains("# TYPE webhook_ingest_build_info gauge\n"),
            "{text}"
        );
        assert!(
            text.contains("webhook_ingest_build_info{version=\"1.2.3\",revision=\"0123abc\"} 1\n"),
            "{text}"
        );
        let mut registry = Registry::default();
        registry.register_collector(Box::new(BuildInfo {
            name: "outbox_relay_build_info",
            version: "1.2.3",
            revision: None,
        }));
        assert!(
            scrape(&registry).contains("outbox_relay_build_info{version=\"1.2.3\"} 1\n"),
            "no revision label when the build was not told one"
        );
    }

    /// A pool that has opened nothing yet (connections open on demand): its
    /// size, and every state at 0 rather than missing.
    #[test]
    fn pool_gauges_exist_before_any_connection() {
        let database = db::Database::parse("postgres://nobody@127.0.0.1:1/none").expect("a valid URL");
        let pool = database.pool(&db::ConnectOptions {
            application_name: "metrics-test",
            statement_timeout: None,
            lock_timeout: None,
            abort_when_client_leaves: false,
            asynchronous_commit: false,
            generic_plans: false,
            index_paths: false,
            pool_size: 3,
            pool_wait: std::time::Duration::from_millis(10),
        });
        let mut registry = Registry::default();
        registry.register_collector(Box::new(PoolCollector { pool }));
        let text = scrape(&registry);
        for line in [
            "db_pool_connections{state=\"idle\"} 0\n",
            "db_pool_connections{state=\"in_use\"} 0\n",
            "db_pool_max_connections 3\n",
            "db_pool_waiters 0\n",
        ] {
            assert!(text.contains(line), "{line:?} in {text}");
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn process_metrics_under_the_client_libraries_names() {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(ProcessCollector));
        let text = scrape(&registry);
        for (name, kind) in [
            ("process_cpu_seconds", "counter"),
            ("process_resident_memory_bytes", "gauge"),
            ("process_virtual_memory_bytes", "gauge"),
            ("process_open_fds", "gauge"),
            ("process_max_fds", "gauge"),
            ("process_start_time_seconds", "gauge"),
        ] {
            assert!(
                text.contains(&format!("# TYPE {name} {kind}\n")),
                "{name}: {text}"
            );
        }
        assert!(text.contains("\nprocess_cpu_seconds_total "), "{text}");
    }
}
