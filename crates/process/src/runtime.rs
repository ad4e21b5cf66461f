//! The tokio runtime: one thread ([`Threads::One`], the relay) or one worker
//! thread per CPU the process may use ([`Threads::PerCpu`], the ingest).
//!
//! One thread suits a service whose work per unit is small beside the waits
//! on Postgres and the network, and whose units hand off to each other: the
//! relay's claimer, its calls and its recorder pass every row along. On two
//! workers a row's hand-offs wake the other thread (work stealing, a futex
//! and an epoll per wake-up): measured by `make bench`'s relay drain, 39 us
//! of the relay's CPU per row on two workers, 26-31 on one thread. At 30 us
//! a row, one thread carries some 33,000 rows a
//! second of the relay's own work; past that, more relays (each claims its
//! own rows), not more threads, is how it scales. The ingest's requests are
//! independent of each other and verify signatures (CPU) between waits: it
//! runs a worker per CPU.
//!
//! Per CPU, in a container that CPU is the cgroup's quota, not the node's cores: a
//! pod limited to 2 CPUs on a 64-core node that ran 64 workers would spend
//! its quota early in each period and sit throttled for the rest of it. So
//! the quota is read first, in the order the kernel may offer it:
//! 1. cgroup v2: `cpu.max` (`<quota> <period>`, or `max <period>` when
//!    unlimited), in the process's own cgroup (named by `/proc/self/cgroup`)
//!    and at the mount's root (what a container with its own cgroup
//!    namespace sees);
//! 2. cgroup v1: `cpu.cfs_quota_us` (`-1` when unlimited) and
//!    `cpu.cfs_period_us`, at the `cpu` controller's usual mount points;
//! 3. otherwise [`std::thread::available_parallelism`] (the CPUs this
//!    process may be scheduled on).
//!
//! A fractional quota is rounded up (1.5 CPUs: two workers, throttled
//! together at 1.5): our handlers mostly wait on Postgres and the network,
//! and a ready task with no free worker costs more latency than a short
//! throttle. The count never exceeds the CPUs available to the process,
//! never falls below one.
//!
//! The parsers are pure functions over the files' contents, tested below;
//! only [`cpu_quota`] reads files.

use std::num::NonZeroUsize;

/// A CPU quota: `quota_us` of CPU time in every `period_us` of wall time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuQuota {
    pub quota_us: u64,
    pub period_us: u64,
}

impl CpuQuota {
    /// Worker threads for this quota: the CPUs it allows, rounded up, at least one.
    pub fn worker_threads(self) -> usize {
        usize::try_from(self.quota_us.div_ceil(self.period_us))
            .unwrap_or(usize::MAX)
            .max(1)
    }
}

/// Parses cgroup v2 `cpu.max`: `"200000 100000"` is two CPUs; `"max 100000"`
/// (no limit) and anything unreadable are `None`.
pub fn parse_cpu_max(contents: &str) -> Option<CpuQuota> {
    let mut fields = contents.split_whitespace();
    let quota = fields.next()?;
    // The period may be omitted when written; the kernel's default is 100 ms.
    let period = fields.next().unwrap_or("100000");
    quota_of(quota, period)
}

/// Parses cgroup v1 `cpu.cfs_quota_us` and `cpu.cfs_period_us`: `"-1"` (no
/// limit) and anything unreadable are `None`.
pub fn parse_cfs(quota_us: &str, period_us: &str) -> Option<CpuQuota> {
    quota_of(quota_us.trim(), period_us.trim())
}

fn quota_of(quota: &str, period: &str) -> Option<CpuQuota> {
    // "max" (v2) and "-1" (v1) fail to parse as u64: no limit.
    let quota_us: u64 = quota.parse().ok()?;
    let period_us: u64 = period.parse().ok()?;
    (quota_us > 0 && period_us > 0).then_some(CpuQuota { quota_us, period_us })
}

/// The process's cgroup v2 path from `/proc/self/cgroup` (its `0::<path>` line).
pub fn cgroup_v2_path(proc_self_cgroup: &str) -> Option<&str> {
    proc_self_cgroup
        .lines()
        .find_map(|line| line.strip_prefix("0::"))
        .map(str::trim)
}

/// The quota of the cgroup this process runs in, if it has one.
pub fn cpu_quota() -> Option<CpuQuota> {
    const ROOT: &str = "/sys/fs/cgroup";
    let read = |path: &str| std::fs::read_to_string(path).ok();
    let own = read("/proc/self/cgroup")
        .as_deref()
        .and_then(cgroup_v2_path)
        .filter(|path| *path != "/")
        .map(|path| format!("{ROOT}{path}/cpu.max"));
    let v2 = own
        .into_iter()
        .chain([format!("{ROOT}/cpu.max")])
        .find_map(|path| read(&path));
    if let Some(contents) = v2 {
        return parse_cpu_max(&contents);
    }
    ["cpu", "cpu,cpuacct"].iter().find_map(|controller| {
        let quota = read(&format!("{ROOT}/{controller}/cpu.cfs_quota_us"))?;
        let period = read(&format!("{ROOT}/{controller}/cpu.cfs_period_us"))?;
        parse_cfs(&quota, &period)
    })
}

/// Worker threads for this process: see the module's doc.
pub fn worker_threads() -> usize {
    let available = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
    sized(cpu_quota(), available)
}

fn sized(quota: Option<CpuQuota>, available: usize) -> usize {
    quota
        .map_or(available, |q| q.worker_threads().min(available))
        .max(1)
}

/// How many threads run a service's tasks: see the module's doc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threads {
    /// Every task on the thread that runs the service (a current-thread
    /// runtime).
    One,
    /// [`worker_threads`] workers.
    PerCpu,
}

/// The runtime `threads` asks for, timers and I/O on, and its thread count.
pub fn build(threads: Threads) -> std::io::Result<(tokio::runtime::Runtime, usize)> {
    match threads {
        Threads::One => Ok((
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?,
            1,
        )),
        Threads::PerCpu => {
            let workers = worker_threads();
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(workers)
                .enable_all()
                .build()?;
            Ok((runtime, workers))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(quota_us: u64, period_us: u64) -> Option<CpuQuota> {
        Some(CpuQuota { quota_us, period_us })
    }

    #[test]
    fn cgroup_v2_cpu_max() {
        assert_eq!(parse_cpu_max("200000 100000\n"), quota(200_000, 100_000));
        assert_eq!(parse_cpu_max("150000 100000"), quota(150_000, 100_000));
        assert_eq!(parse_cpu_max("50000"), quota(50_000, 100_000));
        assert_eq!(parse_cpu_max("max 100000\n"), None);
        assert_eq!(parse_cpu_max(""), None);
        assert_eq!(parse_cpu_max("0 100000"), None);
        assert_eq!(parse_cpu_max("garbage 100000"), None);
    }

    #[test]
    fn cgroup_v1_cfs_quota_and_period() {
        assert_eq!(parse_cfs("400000\n", "100000\n"), quota(400_000, 100_000));
        assert_eq!(parse_cfs("25000", "50000"), quota(25_000, 50_000));
        assert_eq!(parse_cfs("-1\n", "100000\n"), None);
        assert_eq!(parse_cfs("100000", "0"), None);
        assert_eq!(parse_cfs("", ""), None);
    }

    #[test]
    fn the_own_cgroup_is_the_unified_line() {
        let v2 = "0::/kubepods.slice/pod1234/cri-containerd-abcd.scope\n";
        assert_eq!(
            cgroup_v2_path(v2),
            Some("/kubepods.slice/pod1234/cri-containerd-abcd.scope")
        );
        let hybrid = "12:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n0::/docker/abc\n";
        assert_eq!(cgroup_v2_path(hybrid), Some("/docker/abc"));
        assert_eq!(cgroup_v2_path("4:memory:/x\n1:cpu:/\n"), None);
    }

    #[test]
    fn one_thread_is_a_current_thread_runtime() {
        use tokio::runtime::RuntimeFlavor;
        let (one, count) = build(Threads::One).unwrap();
        assert_eq!(
            (one.handle().runtime_flavor(), count),
            (RuntimeFlavor::CurrentThread, 1)
        );
        let (per_cpu, count) = build(Threads::PerCpu).unwrap();
        assert_eq!(
            (per_cpu.handle().runtime_flavor(), count),
            (RuntimeFlavor::MultiThread, worker_threads())
        );
    }

    #[test]
    fn fractions_round_up_within_the_available_cpus() {
        assert_eq!(quota(150_000, 100_000).unwrap().worker_threads(), 2);
        assert_eq!(quota(50_000, 100_000).unwrap().worker_threads(), 1);
        assert_eq!(quota(400_000, 100_000).unwrap().worker_threads(), 4);
        assert_eq!(sized(quota(400_000, 100_000), 2), 2, "no more than the CPUs");
        assert_eq!(sized(quota(100_000, 100_000), 64), 1, "the quota, not the node");
        assert_eq!(sized(None, 8), 8, "no quota: every available CPU");
    }
}
