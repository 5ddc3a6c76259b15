//! The links of a cluster member, driven by hand: a cluster of more masters than a client once
//! could follow.

use super::*;

/// A member whose seed is set up and whose topology (by `CLUSTER SLOTS`) is `ranges`; the
/// masters' links connected and set up (one server each, as far as run ids go).
fn wide_member(ranges: &[(u16, u16, u16)]) -> (Net, Vec<usize>) {
    let mut net = Net::new("redis+cluster://127.0.0.1:7000");
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
