//! The standard process metrics every Prometheus client exports (`process_cpu_seconds_total`,
//! `process_resident_memory_bytes`, `process_virtual_memory_bytes`, `process_open_fds`,
//! `process_max_fds`, `process_start_time_seconds`), with the names and units of the client
//! libraries' process collectors, so dashboards and alerts written for any service work here.
//!
//! Read from `/proc/self` on each scrape (Linux only; elsewhere the series are left out rather
//! than shown as zeros). A figure that cannot be read is left out, never a failed scrape.

use std::fmt::Write as _;

/// Appends the process metrics to `out`.
pub(crate) fn render(out: &mut String) {
    #[cfg(target_os = "linux")]
    linux::render(out);
    #[cfg(not(target_os = "linux"))]
    let _ = out;
}

/// One metric's `# HELP`, `# TYPE` and its sample.
fn sample(out: &mut String, name: &str, kind: &str, help: &str, value: f64) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    let _ = writeln!(out, "{name} {value}");
}

#[cfg(target_os = "linux")]
mod linux {
    use procfs::process::{LimitValue, Process};

    use super::sample;

    pub(super) fn render(out: &mut String) {
        let Ok(process) = Process::myself() else {
            return;
        };
        if let Ok(stat) = process.stat() {
            let ticks = procfs::ticks_per_second() as f64;
            sample(
                out,
                "process_cpu_seconds_total",
                "counter",
                "Total user and system CPU time spent in seconds.",
                (stat.utime + stat.stime) as f64 / ticks,
            );
            sample(
                out,
                "process_virtual_memory_bytes",
                "gauge",
                "Virtual memory size in bytes.",
                stat.vsize as f64,
            );
            sample(
                out,
                "process_resident_memory_bytes",
                "gauge",
                "Resident memory size in bytes.",
                (stat.rss * procfs::page_size()) as f64,
            );
            if let Ok(boot) = procfs::boot_time_secs() {
                sample(
                    out,
                    "process_start_time_seconds",
                    "gauge",
                    "Start time of the process since unix epoch in seconds.",
                    boot as f64 + stat.starttime as f64 / ticks,
                );
            }
        }
        if let Ok(open) = process.fd_count() {
            sample(
                out,
                "process_open_fds",
                "gauge",
                "Number of open file descriptors.",
                open as f64,
            );
        }
        if let Ok(limits) = process.limits() {
            if let LimitValue::Value(max) = limits.max_open_files.soft_limit {
                sample(
                    out,
                    "process_max_fds",
                    "gauge",
                    "Maximum number of open file descriptors.",
                    max as f64,
                );
            }
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    #[test]
    fn the_standard_process_series_are_read_from_proc() {
        let mut out = String::new();
        super::render(&mut out);
        for name in [
            "process_cpu_seconds_total",
            "process_virtual_memory_bytes",
            "process_resident_memory_bytes",
            "process_start_time_seconds",
            "process_open_fds",
            "process_max_fds",
        ] {
            let value: f64 = out
                .lines()
                .find_map(|line| line.strip_prefix(&format!("{name} ")))
                .unwrap_or_else(|| panic!("{name} missing from:\n{out}"))
                .parse()
                .expect("a number");
            assert!(value >= 0.0, "{name} {value}");
        }
    }
}
