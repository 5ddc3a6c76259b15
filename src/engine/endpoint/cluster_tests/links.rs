//! The links of a cluster member, driven by hand: a cluster of more masters than a client once
//! could follow, and links to masters that left the topology closed and their places reused
//! (once they owe nothing).

use super::*;

/// A member whose seed is set up and whose topology (by `CLUSTER SLOTS`) is `ranges`; the
/// masters' links connected and set up (one server each, as far as run ids go).
fn wide_member(ranges: &[(u16, u16, u16)]) -> (Net, Vec<usize>) {
    wide_member_at("redis+cluster://127.0.0.1:7000", ranges)
}

/// [`wide_member`] for the member's URL `url`.
fn wide_member_at(url: &str, ranges: &[(u16, u16, u16)]) -> (Net, Vec<usize>) {
    let mut net = Net::new(url);
    net.ep.connect_all(net.now);
    assert_eq!(net.connect(), [0]);
    net.output(0);
    net.answer_setup(0, 's');
    assert_eq!(net.output(0), ["CLUSTER SHARDS"]);
    net.reply(
        0,
        b"-ERR unknown subcommand 'SHARDS'. Try CLUSTER HELP.\r\n",
    );
    assert_eq!(net.output(0), ["CLUSTER SLOTS"]);
    net.reply(0, &slots(ranges));
    let links = net.connect();
    for &link in &links {
        net.output(link);
        net.answer_setup(link, 'a');
    }
    (net, links)
}

fn leak(s: String) -> &'static [u8] {
    Box::leak(s.into_bytes().into_boxed_slice())
}

#[test]
fn a_member_of_more_than_64_masters_routes_every_slot_to_its_master() {
    const MASTERS: u16 = 300;
    let width = (cluster::SLOTS / MASTERS as usize) as u16;
    let ranges: Vec<(u16, u16, u16)> = (0..MASTERS)
        .map(|k| {
            let last = if k == MASTERS - 1 {
                cluster::SLOTS as u16 - 1
            } else {
                (k + 1) * width - 1
            };
            (k * width, last, 7001 + k)
        })
        .collect();
    let (mut net, links) = wide_member(&ranges);
    assert_eq!(links.len(), MASTERS as usize, "a link per master");
    for i in 0..1000 {
        let key = leak(format!("wide:{i}"));
        let slot = key_slot(key);
        let k = ranges
            .iter()
            .position(|r| r.0 <= slot && slot <= r.1)
            .unwrap();
        let mut m = Keyed::new(key);
        net.step(&mut m);
        assert!(m.failures.is_empty(), "{:?} for slot {slot}", m.failures);
        assert_eq!(
            net.output(links[k]),
            [format!("SET wide:{i} v")],
            "slot {slot} goes to its master, on port {}",
            ranges[k].2
        );
    }
}

/// Answers every pending connect; returns the connections opened and closed.
fn io(net: &mut Net) -> (Vec<ConnId>, Vec<ConnId>) {
    let (mut opened, mut closed) = (Vec::new(), Vec::new());
    while let Some(io) = net.ep.poll_io() {
        match io {
            Io::Connect(id) => {
                net.ep.handle_connected(id);
                opened.push(id);
            }
            Io::Close(id) => closed.push(id),
            Io::Probe { id, .. } => net.ep.handle_probed(id, Probed::Nothing, net.now),
            // No Sentinel member here.
            Io::Resolve { .. } => {}
        }
    }
    (opened, closed)
}

/// Reads the topology again (the periodic read), with the one master at `port`.
fn reread(net: &mut Net, port: u16) {
    net.now += cluster::REFRESH_PERIOD;
    net.ep.handle_timeout(net.now);
    assert_eq!(net.output(0), ["CLUSTER SLOTS"]);
    net.reply(0, &slots(&[(0, 16383, port)]));
}

#[test]
fn links_to_masters_that_left_the_topology_are_closed_and_their_places_reused() {
    let (mut net, links) = wide_member(&[(0, 16383, 7001)]);
    let mut link = links[0];
    for k in 0..500u16 {
        reread(&mut net, 7002 + k);
        let (opened, closed) = io(&mut net);
        assert_eq!(opened, [cmd(opened[0].node)], "move {k}: one link connects");
        assert_eq!(closed, [cmd(link)], "move {k}: the old one closes");
        link = opened[0].node;
        assert_eq!(
            net.ep.node_addr(link).addrs[0].port(),
            7002 + k,
            "the link is to the new address"
        );
        net.output(link);
        net.answer_setup(link, 'a');
        let mut m = Keyed::new(b"a");
        let run = net.step(&mut m);
        assert_eq!(net.output(link), ["SET a v"], "move {k}");
        net.reply(link, b"+OK\r\n");
        net.deliver(run, &mut m);
        assert_eq!(m.replies, ["Simple([79, 75])"], "move {k}");
        assert!(
            net.ep.nodes.len() <= 3,
            "move {k}: {} nodes for a seed and one master",
            net.ep.nodes.len()
        );
    }
}

#[test]
fn a_link_that_owes_a_reply_is_closed_only_once_it_is_answered() {
    let (mut net, links) = wide_member(&[(0, 16383, 7001)]);
    let old = links[0];
    let mut m = Keyed::new(b"a");
    let run = net.step(&mut m);
    assert_eq!(net.output(old), ["SET a v"]);
    reread(&mut net, 7002);
    let (opened, closed) = io(&mut net);
    assert_eq!(opened.len(), 1);
    assert!(closed.is_empty(), "it owes a reply: {closed:?}");
    // The reply comes, and reaches its owner.
    net.reply(old, b"+OK\r\n");
    net.deliver(run, &mut m);
    assert_eq!(m.replies, ["Simple([79, 75])"]);
    reread(&mut net, 7002);
    let (opened, closed) = io(&mut net);
    assert!(opened.is_empty());
    assert_eq!(closed, [cmd(old)], "answered, it closes at the next read");
    // Its place goes to the next master.
    reread(&mut net, 7003);
    let (opened, _) = io(&mut net);
    assert_eq!(opened, [cmd(old)]);
    assert_eq!(net.ep.node_addr(old).addrs[0].port(), 7003);
}

#[test]
fn a_link_with_a_wake_channel_closes_once_the_channel_moved_and_left() {
    let (mut net, links) = wide_member(&[(0, 16383, 7001)]);
    let old = links[0];
    let mut w = Waiter::new(b"a");
    net.run(None, &mut w);
    let (opened, _) = io(&mut net);
    assert_eq!(opened, [sub(old)], "subscribed at the master of its slot");
    let ch = "redlock-mux:wake:{a}";
    assert_eq!(net.output_of(sub(old)), [format!("SSUBSCRIBE {ch}")]);
    net.reply_to(sub(old), &push("ssubscribe", ch, ":1"));
    reread(&mut net, 7002);
    let (opened, closed) = io(&mut net);
    let new = opened[0].node;
    assert_eq!(opened, [cmd(new), sub(new)], "the channel follows its slot");
    assert_eq!(net.output_of(sub(new)), [format!("SSUBSCRIBE {ch}")]);
    assert_eq!(net.output_of(sub(old)), [format!("SUNSUBSCRIBE {ch}")]);
    assert!(closed.is_empty(), "its unsubscription is owed: {closed:?}");
    net.reply_to(sub(old), &push("sunsubscribe", ch, ":0"));
    reread(&mut net, 7002);
    let (opened, closed) = io(&mut net);
    assert!(opened.is_empty());
    assert_eq!(
        closed,
        [cmd(old), sub(old)],
        "the old master's link closes once its channel left"
    );
}

/// A lost attempt's cleanup kept on a `?waitaof` link (no `WAITAOF` confirmed it) while a
/// topology read gives every slot of that link's master to another: the read comes while the
/// link still owes its own `WAITAOF`, so the cleanup stays. Once the link has answered, the
/// cleanup goes to the slot's new master at once, not at the next periodic read (10 s later,
/// or never within the key's TTL): found by a real-server test that failed under load.
#[test]
fn a_kept_cleanup_leaves_a_link_out_of_the_map_once_the_link_has_answered() {
    assert!(key_slot(b"a") >= 8192);
    let (mut net, links) = wide_member_at(
        "redis+cluster://127.0.0.1:7000?waitaof=0,1",
        &[(0, 8191, 7001), (8192, 16383, 7002)],
    );
    let (new, old) = (links[0], links[1]);
    // A cleanup: no round reads its reply.
    let mut m = Deleting::new(b"a", net.now + Duration::from_secs(20));
    net.run(None, &mut m);
    assert_eq!(
        net.output(old),
        ["DEL a"],
        "the cleanup, without a WAITAOF of its own"
    );
    net.reply(old, b":1\r\n");
    let waits = net.output(old);
    assert!(
        waits.len() == 1 && waits[0].starts_with("WAITAOF 0 1"),
        "the idle link's own WAITAOF: {waits:?}"
    );
    // While that WAITAOF is in flight, the periodic read gives every slot to port 7001.
    net.now += cluster::REFRESH_PERIOD;
    net.ep.handle_timeout(net.now);
    assert_eq!(net.output(0), ["CLUSTER SLOTS"]);
    net.reply(0, &slots(&[(0, 16383, 7001)]));
    let _ = io(&mut net);
    assert!(
        !net.output(new).iter().any(|c| c == "DEL a"),
        "the link still owes its WAITAOF: what it answers may confirm the cleanup"
    );
    // It answers short: the link owes nothing now, and is out of the map.
    net.reply(old, b"*2\r\n:0\r\n:0\r\n");
    let mut sent = net.output(new);
    for _ in 0..20 {
        if sent.iter().any(|c| c == "DEL a") {
            break;
        }
        net.now += 100 * MS;
        net.ep.handle_timeout(net.now);
        let _ = io(&mut net);
        if net.output(old).iter().any(|c| c.starts_with("WAITAOF")) {
            net.reply(old, b"*2\r\n:0\r\n:0\r\n");
        }
        assert!(
            net.output(0).is_empty(),
            "no topology read before the periodic one"
        );
        sent.extend(net.output(new));
    }
    assert!(
        sent.iter().any(|c| c == "DEL a"),
        "the cleanup stayed on the link out of the map: the new master got {sent:?}"
    );
}
