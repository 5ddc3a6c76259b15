//! Helpers shared by the integration tests: real `redis-server` processes, and a tiny RESP
//! client and a scripted fake server (see `redlock_mux_kit`).

// Each test crate uses a different subset of these helpers.
#![allow(unused_imports)]

pub use redlock_mux_kit::local_servers::*;
pub use redlock_mux_kit::probe::*;
pub use redlock_mux_kit::{assert_settles, assert_settles_eq};

#[allow(dead_code)]
pub mod cluster;
#[allow(dead_code)]
pub mod process;
#[allow(dead_code)]
pub mod sentinel;

/// A client of `urls` that makes one attempt per operation, with the given node timeout.
#[allow(dead_code)]
pub fn one_try_client(urls: &[String], node_timeout: std::time::Duration) -> redlock_mux::Client {
    redlock_mux::Client::builder()
        .nodes(urls)
        .node_timeout(node_timeout)
        .retry_count(0)
        .build()
        .expect("valid client")
}
