//! One server must never count as two nodes: a client whose node list reaches the same server
//! at two addresses (its IPv6 and IPv4 loopback, a proxy in front of it, two names) would let
//! that server hold two votes of three. Such a list is a configuration error, whatever the
//! addresses, found from the `run_id` each node's setup reads (`INFO server`).

mod common;
use redlock_mux_kit::fault_proxy;

use std::time::Duration;

use common::*;
use redlock_mux::{Client, Error, NodeErrorKind};

/// `nodes` is refused: nodes 0 and 1 are one server (whichever set up second is named).
fn assert_refused(nodes: &[String]) {
    match Client::builder()
        .nodes(nodes)
        .connect_timeout(Duration::from_secs(2))
        .build()
    {
        Err(Error::Config { failures }) => {
            assert!(
                failures.iter().any(|f| matches!(&f.kind,
                    NodeErrorKind::Setup { cause, .. }
                        if matches!(**cause, NodeErrorKind::SameServer { node }
                            if node + f.node == 1))),
                "{failures:?}"
            );
        }
        other => panic!("{nodes:?} were accepted as three nodes: {other:?}"),
    }
}

#[test]
fn a_server_reached_at_two_loopback_addresses_is_refused() {
    // Bound to 127.0.0.1 and 127.0.0.2: two addresses of one server.
    let twin = RedisServer::start_with(&["--bind", "127.0.0.1", "127.0.0.2"]).expect("redis");
    let other = RedisServer::start().expect("redis");
    let port = twin.port();
    assert_refused(&[
        format!("redis://127.0.0.1:{port}"),
        format!("redis://127.0.0.2:{port}"),
        other.url(),
    ]);
    // IPv6 loopback too, where the machine has it.
    if let Ok(six) = RedisServer::start_with(&["--bind", "127.0.0.1", "::1"]) {
        let p = six.port();
        assert_refused(&[
            format!("redis://[::1]:{p}"),
            format!("redis://127.0.0.1:{p}"),
            other.url(),
        ]);
    }
}

#[test]
fn a_server_reached_directly_and_through_a_proxy_is_refused() {
    let cluster = RedisCluster::start(2).expect("redis");
    let proxy = fault_proxy::FaultProxy::start(cluster.addrs()[0], Duration::ZERO).expect("proxy");
    assert_refused(&[
        cluster.urls()[0].clone(),
        proxy.url(),
        cluster.urls()[1].clone(),
    ]);
}

#[test]
fn distinct_servers_are_accepted() {
    let cluster = RedisCluster::start(3).expect("redis");
    let client = Client::new(cluster.urls()).expect("three servers");
    client
        .try_lock("k", Duration::from_secs(5))
        .expect("lock")
        .release()
        .expect("release");
}
