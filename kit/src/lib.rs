//! What the project's tests, the command's `bench` and the peer benchmark share, so that each
//! is written once:
//!
//! - [`local_servers`]: real `redis-server` processes on free 127.0.0.1 ports (or Unix
//!   sockets), in temporary directories, stopped by PID even on panic;
//! - [`raw`]: the raw Redlock baselines (`raw`, `rawQ`, `rawQ-rw`) the benchmarks measure
//!   against;
//! - [`stats`]: latency percentiles and summaries;
//! - [`history`]: the history checker of the safety suites and the simulation;
//! - [`fault_proxy`]: an in-process TCP proxy that delays, drops or resets;
//! - [`pki`]: throw-away certificates made with `openssl`, for TLS tests and `bench --tls`;
//! - [`probe`] (feature `probe`): a tiny blocking RESP client for assertions about what a
//!   server holds, and a scripted fake server for what no installable server does;
//! - [`sentinel`] (feature `probe`): masters managed by Redis Sentinel (a master, a replica
//!   and three sentinels per member), for the tests and `bench --sentinel`.
//!
//! Std only (and `rustix` for `poll`), but for `probe`, which decodes with the library's codec.

pub mod fault_proxy;
pub mod history;
pub mod local_servers;
pub mod pki;
#[cfg(feature = "probe")]
pub mod probe;
pub mod raw;
#[cfg(feature = "probe")]
pub mod sentinel;
pub mod stats;
