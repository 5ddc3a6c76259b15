//! The history checker shared by every safety suite: the deterministic simulation of the core
//! (`src/engine/sim`) and the fault suites against real `redis-server`.
//!
//! A history is a list of [`Op`]s on one monotonic clock, as offsets from a common origin (the
//! simulation's virtual time, or `Instant`s of one process minus a shared start). Each granted
//! op holds its key *exclusively* (a mutex or a write lock) or *shared* (a read lock) over its
//! window `[ok, min(release, valid_until)]`: from the grant until it is released or its validity,
//! as the client measured it, runs out. The checker finds:
//!
//! - **overlaps**: two windows of the same key that intersect, where at least one is exclusive
//!   (readers may overlap readers; writers overlap nothing);
//! - **lost updates** of a read-modify-write counter kept per key: every [`Increment`] read a
//!   value and wrote it plus one; increments minus the counter's growth were lost;
//! - **lost writes inside a window**: an increment written while its writer held the key,
//!   that the next such writer did not read (or the counter did not end with), when no write
//!   outside a window could have come between: the lock let a holder in before the last
//!   holder's write could be seen;
//! - **fencing** order: the fencing tokens of exclusive grants strictly increase in grant order;
//! - **writes outside the window**: an increment written when its writer no longer held the key;
//! - **more than k holders**: a semaphore of `k` permits ([`Kind::Permit`]) held by more than
//!   `k` windows at some instant. Permit windows are checked only against each other (a
//!   semaphore's keys are its own);
//! - **releases reported done that did not happen**: a release that returned `Ok` while the
//!   lock's entries were still live on more nodes than its release quorum allows (more than
//!   N − quorum: a quorum acknowledged deleting them, so at most the others may still hold
//!   them) ([`Release`], recorded by a harness that can look at the nodes);
//! - **keys left behind**: keys still on a node once every release returned and every client
//!   closed, in runs where nothing may be left ([`History::left_behind`]).
//!
//! Lost updates and lost writes inside a window differ where a write lands outside its window.
//! One late write of an old value undoes every increment made since its writer read: all of
//! them are lost updates, but none is the lock's doing. Where a writer checks its validity and
//! writes at one instant (the simulation's checked scenarios), no write is outside a window
//! and every lost update is a violation ([`Report::violations`]). Where a thread may be
//! descheduled between the check and the write (real processes on a loaded machine), writes
//! outside a window happen and are reported on their own; what the lock answers for is
//! [`Report::lock_violations`].
use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// What an op holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// An exclusive mutex.
    Mutex,
    /// The shared side of a read-write lock.
    Read,
    /// The exclusive side of a read-write lock.
    Write,
    /// One permit of a semaphore of `permits` permits.
    Permit {
        /// How many holders the semaphore admits at once.
        permits: u32,
    },
}

impl Kind {
    /// Whether this kind excludes every other holder of its key.
    pub fn exclusive(self) -> bool {
        !matches!(self, Kind::Read | Kind::Permit { .. })
    }
}

/// A stretch of time in which a semaphore had more holders than permits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Excess {
    /// The semaphore's key.
    pub key: Vec<u8>,
    /// Its permits.
    pub permits: u32,
    /// The most holders at once in the stretch.
    pub holders: usize,
    /// When it began.
    pub at: Duration,
}

/// One lock operation, granted or not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    /// Who asked (a thread, a process, a simulated client).
    pub client: u64,
    /// What it holds.
    pub kind: Kind,
    /// The resource.
    pub key: Vec<u8>,
    /// When the acquisition was called.
    pub invoke: Duration,
    /// When it was granted; `None` if it was not.
    pub ok: Option<Duration>,
    /// The fencing token of the grant, once fencing exists.
    pub fence: Option<u64>,
    /// When the grant stops being valid, by the client's own measurement (updated by extends).
    pub valid_until: Option<Duration>,
    /// When the holder started releasing it; `None` if it never did (crash, or it let it expire).
    pub release: Option<Duration>,
}

impl Op {
    /// The window in which this op held its key, if it was granted and the window is not empty.
    pub fn window(&self) -> Option<(Duration, Duration)> {
        let ok = self.ok?;
        let end = match (self.release, self.valid_until) {
            (Some(r), Some(v)) => r.min(v),
            (Some(r), None) => r,
            (None, Some(v)) => v,
            (None, None) => return None,
        };
        (end > ok).then_some((ok, end))
    }
}

/// One read-modify-write of the per-key counter: read `read`, wrote `read + 1` at `at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Increment {
    /// Who wrote.
    pub client: u64,
    /// Whose counter.
    pub key: Vec<u8>,
    /// The value read.
    pub read: u64,
    /// When `read + 1` was written.
    pub at: Duration,
    /// The op (index into [`History::ops`]) under whose grant the writer believed it acted.
    pub op: usize,
}

/// A release that returned `Ok`, and what the nodes held of its lock at that instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    /// The op released (index into [`History::ops`]).
    pub op: usize,
    /// When the release returned.
    pub at: Duration,
    /// The nodes on which the lock's entries were still live then.
    pub live_on: Vec<usize>,
    /// How many nodes the lock is on, and how many must acknowledge a release.
    pub nodes: usize,
    /// See `nodes`.
    pub quorum: usize,
}

impl Release {
    /// Whether more nodes still held the lock than the release allows.
    pub fn did_not_happen(&self) -> bool {
        self.live_on.len() > self.nodes.saturating_sub(self.quorum)
    }
}

/// A semaphore's window starts (`true`) and ends, by time.
type Events = Vec<(Duration, bool)>;

/// The increments of one key, as [`History::check`] sorts them.
#[derive(Default)]
struct Writes {
    /// How many.
    count: u64,
    /// Those written inside their window: when, when the window started, which increment.
    inside: Vec<(Duration, Duration, usize)>,
    /// Those written outside: the earliest and the latest they can have been written.
    outside: Vec<(Duration, Duration)>,
}

/// Everything recorded in one run.
#[derive(Debug, Default, Clone)]
pub struct History {
    /// The lock operations, in any order.
    pub ops: Vec<Op>,
    /// The counter increments, in any order.
    pub increments: Vec<Increment>,
    /// Each counter's value at the start and at the end of the run.
    pub counters: BTreeMap<Vec<u8>, (u64, u64)>,
    /// The releases that returned `Ok`, as far as the harness could look at the nodes.
    pub releases: Vec<Release>,
    /// Keys (node, name) still on the nodes once every release returned and every client
    /// closed, in a run where nothing may be left.
    pub left_behind: Vec<(usize, Vec<u8>)>,
}

/// Two windows of one key that overlap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overlap {
    /// The key.
    pub key: Vec<u8>,
    /// The earlier-granted op (index into [`History::ops`]).
    pub first: usize,
    /// The later-granted op.
    pub second: usize,
    /// How long they overlapped.
    pub by: Duration,
}

/// An increment written inside its writer's window that was lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostWrite {
    /// The counter's key.
    pub key: Vec<u8>,
    /// The increment (index into [`History::increments`]).
    pub increment: usize,
    /// The value it wrote.
    pub wrote: u64,
    /// What the next writer inside a window read instead (`None`: the counter's final value
    /// was not it, and nobody wrote after it).
    pub next_read: Option<u64>,
    /// What the counter ended with, when it is the final value that was not it.
    pub end: u64,
}

/// What [`History::check`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Ops recorded.
    pub ops: usize,
    /// Ops granted with a non-empty window.
    pub windows: usize,
    /// Increments recorded.
    pub increments: usize,
    /// Overlapping pairs, by the first that overlaps each window (at most one per window).
    pub overlaps: Vec<Overlap>,
    /// Increments minus the counters' growth, summed over keys.
    pub lost_updates: u64,
    /// Increments written inside their writer's window that the next writer inside a window
    /// did not read (or that the counter did not end with), where no write outside a window
    /// could have overwritten them meanwhile.
    pub lost_inside: Vec<LostWrite>,
    /// Exclusive grants whose fencing token did not exceed the previous grant's, per key.
    pub fencing_violations: usize,
    /// Increments written outside their writer's window.
    pub writes_outside: usize,
    /// Stretches of time in which a semaphore had more than its permits' holders.
    pub excess: Vec<Excess>,
    /// The most permit holders seen at once on any one semaphore.
    pub max_holders: usize,
    /// Releases checked, and those reported done that did not happen.
    pub releases: usize,
    pub false_releases: Vec<Release>,
    /// Keys left behind.
    pub left_behind: Vec<(usize, Vec<u8>)>,
}

impl Report {
    /// What the lock answers for whatever its holders' threads do: overlaps, lost writes
    /// inside a window, fencing violations and semaphores past their permits. Writes outside
    /// a window, and the updates they wipe out, are not counted.
    pub fn lock_violations(&self) -> u64 {
        self.overlaps.len() as u64
            + self.lost_inside.len() as u64
            + self.fencing_violations as u64
            + self.excess.len() as u64
            + self.false_releases.len() as u64
            + self.left_behind.len() as u64
    }

    /// [`lock_violations`](Self::lock_violations) plus every lost update, for histories in
    /// which a holder checks its validity and writes at one instant: there a lost update is a
    /// violation whatever caused it. Writes outside the window are a cause, not a violation by
    /// themselves: they show up as lost updates when they hurt.
    pub fn violations(&self) -> u64 {
        self.lock_violations() + self.lost_updates
    }

    /// Adds another run's findings to this one (op indices are then no longer meaningful).
    pub fn absorb(&mut self, other: &Report) {
        self.ops += other.ops;
        self.windows += other.windows;
        self.increments += other.increments;
        self.overlaps.extend(other.overlaps.iter().cloned());
        self.lost_updates += other.lost_updates;
        self.lost_inside.extend(other.lost_inside.iter().cloned());
        self.fencing_violations += other.fencing_violations;
        self.writes_outside += other.writes_outside;
        self.excess.extend(other.excess.iter().cloned());
        self.max_holders = self.max_holders.max(other.max_holders);
        self.releases += other.releases;
        self.false_releases
            .extend(other.false_releases.iter().cloned());
        self.left_behind.extend(other.left_behind.iter().cloned());
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ops, {} windows, {} increments: {} overlaps, {} lost updates, {} lost writes inside their window, {} fencing violations, {} writes outside their window",
            self.ops,
            self.windows,
            self.increments,
            self.overlaps.len(),
            self.lost_updates,
            self.lost_inside.len(),
            self.fencing_violations,
            self.writes_outside
        )?;
        if self.releases > 0 {
            write!(
                f,
                ", {} releases reported done that did not happen (of {})",
                self.false_releases.len(),
                self.releases
            )?;
        }
        if !self.left_behind.is_empty() {
            write!(f, ", {} keys left behind", self.left_behind.len())?;
        }
        if self.max_holders > 0 || !self.excess.is_empty() {
            write!(
                f,
                ", {} instants with more holders than permits (most holders at once: {})",
                self.excess.len(),
                self.max_holders
            )?;
        }
        for e in self.excess.iter().take(3) {
            write!(
                f,
                "\n  {} holders of the {}-permit semaphore {:?} at {:?}",
                e.holders,
                e.permits,
                String::from_utf8_lossy(&e.key),
                e.at
            )?;
        }
        for l in self.lost_inside.iter().take(3) {
            match l.next_read {
                Some(read) => write!(
                    f,
                    "\n  lost on {:?}: increment {} wrote {}, the next writer read {}",
                    String::from_utf8_lossy(&l.key),
                    l.increment,
                    l.wrote,
                    read
                )?,
                None => write!(
                    f,
                    "\n  lost on {:?}: increment {} wrote {}, the counter ended at {}",
                    String::from_utf8_lossy(&l.key),
                    l.increment,
                    l.wrote,
                    l.end
                )?,
            }
        }
        for r in self.false_releases.iter().take(3) {
            write!(
                f,
                "\n  a release reported done that did not happen: op {} at {:?}, still live on \
                 nodes {:?} (of {}, release quorum {})",
                r.op, r.at, r.live_on, r.nodes, r.quorum
            )?;
        }
        for (node, key) in self.left_behind.iter().take(3) {
            write!(
                f,
                "\n  left behind on node {node}: {:?}",
                String::from_utf8_lossy(key)
            )?;
        }
        for o in self.overlaps.iter().take(3) {
            write!(
                f,
                "\n  overlap on {:?}: ops {} and {} by {:?}",
                String::from_utf8_lossy(&o.key),
                o.first,
                o.second,
                o.by
            )?;
        }
        Ok(())
    }
}

impl History {
    /// Records an op and returns its index, for later updates and for [`Increment::op`].
    pub fn push(&mut self, op: Op) -> usize {
        self.ops.push(op);
        self.ops.len() - 1
    }

    /// Appends another history (for example one thread's or one process's) to this one.
    pub fn merge(&mut self, other: History) {
        let base = self.ops.len();
        self.ops.extend(other.ops);
        self.increments
            .extend(other.increments.into_iter().map(|mut i| {
                i.op += base;
                i
            }));
        for (key, (start, end)) in other.counters {
            self.counters.insert(key, (start, end));
        }
        self.releases
            .extend(other.releases.into_iter().map(|mut r| {
                r.op += base;
                r
            }));
        self.left_behind.extend(other.left_behind);
    }

    /// Checks the history; see the module documentation for what is checked.
    pub fn check(&self) -> Report {
        let mut report = Report {
            ops: self.ops.len(),
            increments: self.increments.len(),
            releases: self.releases.len(),
            false_releases: self
                .releases
                .iter()
                .filter(|r| r.did_not_happen())
                .cloned()
                .collect(),
            left_behind: self.left_behind.clone(),
            ..Report::default()
        };
        let mut by_key: BTreeMap<&[u8], Vec<(Duration, Duration, usize)>> = BTreeMap::new();
        let mut permits: BTreeMap<&[u8], (u32, Events)> = BTreeMap::new();
        for (i, op) in self.ops.iter().enumerate() {
            if let Some((start, end)) = op.window() {
                report.windows += 1;
                if let Kind::Permit { permits: k } = op.kind {
                    let entry = permits.entry(&op.key).or_insert((k, Vec::new()));
                    entry.0 = entry.0.min(k);
                    // Ends sort before starts at the same instant: touching windows do not
                    // overlap.
                    entry.1.push((start, true));
                    entry.1.push((end, false));
                    continue;
                }
                by_key.entry(&op.key).or_default().push((start, end, i));
            }
        }
        for (key, (k, mut events)) in permits {
            events.sort();
            let mut holders = 0usize;
            for (at, starts) in events {
                if starts {
                    holders += 1;
                    report.max_holders = report.max_holders.max(holders);
                    if holders == k as usize + 1 {
                        report.excess.push(Excess {
                            key: key.to_vec(),
                            permits: k,
                            holders,
                            at,
                        });
                    } else if holders > k as usize + 1 {
                        if let Some(e) = report.excess.last_mut() {
                            e.holders = e.holders.max(holders);
                        }
                    }
                } else {
                    holders -= 1;
                }
            }
        }
        for (key, mut windows) in by_key {
            windows.sort();
            // Sorted by start, a window overlaps an earlier one iff it starts before the latest
            // end seen so far (of any window if it is exclusive, of exclusive ones if shared).
            let mut last_any: Option<(Duration, usize)> = None;
            let mut last_excl: Option<(Duration, usize)> = None;
            let mut last_fence: Option<u64> = None;
            for &(start, end, i) in &windows {
                let exclusive = self.ops[i].kind.exclusive();
                let against = if exclusive { last_any } else { last_excl };
                if let Some((prev_end, j)) = against.filter(|(e, _)| start < *e) {
                    report.overlaps.push(Overlap {
                        key: key.to_vec(),
                        first: j,
                        second: i,
                        by: prev_end.min(end) - start,
                    });
                }
                if exclusive {
                    if let Some(fence) = self.ops[i].fence {
                        if last_fence.is_some_and(|f| fence <= f) {
                            report.fencing_violations += 1;
                        }
                        last_fence = Some(fence);
                    }
                }
                let later = |slot: &mut Option<(Duration, usize)>| {
                    if slot.is_none_or(|(e, _)| end > e) {
                        *slot = Some((end, i));
                    }
                };
                later(&mut last_any);
                if exclusive {
                    later(&mut last_excl);
                }
            }
        }
        let mut made: BTreeMap<&[u8], Writes> = BTreeMap::new();
        for (i, inc) in self.increments.iter().enumerate() {
            let writes = made.entry(&inc.key).or_default();
            writes.count += 1;
            let op = self.ops.get(inc.op);
            let window = op.and_then(Op::window);
            match window {
                Some((start, end)) if start <= inc.at && inc.at <= end => {
                    writes.inside.push((inc.at, start, i));
                }
                _ => {
                    report.writes_outside += 1;
                    // The write came after its writer read, so after its grant (or its
                    // call), and before it was stamped.
                    let from = op.map_or(Duration::ZERO, |o| o.ok.unwrap_or(o.invoke));
                    writes.outside.push((from, inc.at));
                }
            }
        }
        for (key, mut writes) in made {
            let counter = self.counters.get(key).copied();
            let (start, end) = counter.unwrap_or((0, 0));
            report.lost_updates += writes.count.saturating_sub(end.saturating_sub(start));
            writes.inside.sort();
            // A write outside a window could have landed between a write made at or after
            // `after` and a read made at or before `before`.
            let outside_between = |after: Duration, before: Option<Duration>| {
                writes
                    .outside
                    .iter()
                    .any(|&(from, at)| at >= after && before.is_none_or(|b| from <= b))
            };
            for (n, &(_, start, i)) in writes.inside.iter().enumerate() {
                let wrote = self.increments[i].read + 1;
                // Made inside windows that do not overlap, these writes are in the order the
                // writers made them, and each next one read after this one was written.
                let next = writes.inside.get(n + 1).map(|&(at, _, j)| (at, j));
                let (seen, before, next_read) = match next {
                    Some((at, j)) => {
                        let read = self.increments[j].read;
                        (read == wrote, Some(at), Some(read))
                    }
                    None if counter.is_some() => (end == wrote, None, None),
                    None => (true, None, None),
                };
                if !seen && !outside_between(start, before) {
                    report.lost_inside.push(LostWrite {
                        key: key.to_vec(),
                        increment: i,
                        wrote,
                        next_read,
                        end,
                    });
                }
            }
        }
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn op(client: u64, kind: Kind, ok: u64, end: u64) -> Op {
        Op {
            client,
            kind,
            key: b"k".to_vec(),
            invoke: ms(ok.saturating_sub(1)),
            ok: Some(ms(ok)),
            fence: None,
            valid_until: Some(ms(end)),
            release: None,
        }
    }

    #[test]
    fn exclusive_windows_must_not_overlap_but_readers_may() {
        let mut h = History::default();
        h.push(op(1, Kind::Mutex, 0, 10));
        h.push(op(2, Kind::Mutex, 10, 20));
        assert_eq!(
            h.check().overlaps.len(),
            0,
            "touching windows do not overlap"
        );
        h.push(op(3, Kind::Mutex, 15, 16));
        let r = h.check();
        assert_eq!(r.overlaps.len(), 1);
        assert_eq!((r.overlaps[0].first, r.overlaps[0].second), (1, 2));
        assert_eq!(r.overlaps[0].by, ms(1));

        let mut h = History::default();
        h.push(op(1, Kind::Read, 0, 10));
        h.push(op(2, Kind::Read, 5, 15));
        assert_eq!(h.check().violations(), 0);
        h.push(op(3, Kind::Write, 12, 20));
        assert_eq!(h.check().overlaps.len(), 1);
        h.push(op(4, Kind::Read, 25, 30));
        h.push(op(5, Kind::Write, 30, 31));
        assert_eq!(h.check().overlaps.len(), 1);
    }

    #[test]
    fn release_ends_the_window_and_other_keys_are_independent() {
        let mut h = History::default();
        let mut a = op(1, Kind::Mutex, 0, 100);
        a.release = Some(ms(5));
        h.push(a);
        h.push(op(2, Kind::Mutex, 6, 50));
        let mut c = op(3, Kind::Mutex, 7, 8);
        c.key = b"other".to_vec();
        h.push(c);
        assert_eq!(h.check().violations(), 0);
    }

    #[test]
    fn counts_lost_updates_and_writes_outside() {
        let mut h = History::default();
        let a = h.push(op(1, Kind::Mutex, 0, 10));
        let b = h.push(op(2, Kind::Mutex, 10, 20));
        let inc = |client, read, at, op| Increment {
            client,
            key: b"k".to_vec(),
            read,
            at: ms(at),
            op,
        };
        h.increments.push(inc(1, 0, 5, a));
        h.increments.push(inc(2, 1, 12, b));
        h.counters.insert(b"k".to_vec(), (0, 2));
        assert_eq!(h.check().violations(), 0);
        // A third writer read 1 too and wrote 2 late, over the second's increment.
        h.increments.push(inc(1, 1, 15, a));
        let r = h.check();
        assert_eq!((r.lost_updates, r.writes_outside), (1, 1));
        // The late write explains the loss: the lock let nobody in too early.
        assert_eq!((r.lost_inside.len(), r.lock_violations()), (0, 0), "{r}");
        assert_eq!(r.violations(), 1);
    }

    #[test]
    fn a_write_inside_a_window_that_the_next_holder_did_not_read_is_lost() {
        let inc = |client, read, at, op| Increment {
            client,
            key: b"k".to_vec(),
            read,
            at: ms(at),
            op,
        };
        // The second holder read before the first's write could be seen: the first's write
        // is lost, though nothing overlaps.
        let mut h = History::default();
        let a = h.push(op(1, Kind::Mutex, 0, 10));
        let b = h.push(op(2, Kind::Mutex, 10, 20));
        let c = h.push(op(3, Kind::Mutex, 20, 30));
        h.increments.push(inc(1, 0, 5, a));
        h.increments.push(inc(2, 0, 15, b));
        h.increments.push(inc(3, 1, 25, c));
        h.counters.insert(b"k".to_vec(), (0, 2));
        let r = h.check();
        assert_eq!((r.lost_updates, r.writes_outside), (1, 0), "{r}");
        assert_eq!(r.lost_inside.len(), 1, "{r}");
        assert_eq!(
            (r.lost_inside[0].increment, r.lost_inside[0].next_read),
            (0, Some(0))
        );
        assert_eq!(r.lock_violations(), 1);
        assert!(r.to_string().contains("1 lost writes inside"), "{r}");

        // The last write inside a window must be the counter's final value.
        h.counters.insert(b"k".to_vec(), (0, 1));
        let r = h.check();
        assert_eq!(r.lost_inside.len(), 2, "{r}");
        assert_eq!(
            (r.lost_inside[1].next_read, r.lost_inside[1].end),
            (None, 1)
        );

        // A write outside a window that may have landed in between explains the loss: a
        // fourth writer that read 0 in a window long gone wrote 1 over the first's write.
        let mut h = History::default();
        let late = h.push(op(4, Kind::Mutex, 0, 1));
        let a = h.push(op(1, Kind::Mutex, 2, 10));
        let b = h.push(op(2, Kind::Mutex, 10, 20));
        h.increments.push(inc(1, 0, 5, a));
        h.increments.push(inc(4, 0, 8, late));
        h.increments.push(inc(2, 1, 15, b));
        h.counters.insert(b"k".to_vec(), (0, 2));
        let r = h.check();
        assert_eq!((r.lost_updates, r.writes_outside), (1, 1), "{r}");
        assert_eq!(r.lock_violations(), 0, "{r}");
        // One that was written before the first's window began explains nothing.
        let mut h = History::default();
        let late = h.push(op(4, Kind::Mutex, 0, 1));
        let a = h.push(op(1, Kind::Mutex, 3, 10));
        let b = h.push(op(2, Kind::Mutex, 10, 20));
        h.increments.push(inc(4, 7, 2, late));
        h.increments.push(inc(1, 0, 5, a));
        h.increments.push(inc(2, 0, 15, b));
        h.counters.insert(b"k".to_vec(), (0, 1));
        let r = h.check();
        assert_eq!(r.lost_inside.len(), 1, "{r}");
    }

    #[test]
    fn a_semaphore_admits_at_most_its_permits_at_any_instant() {
        let two = Kind::Permit { permits: 2 };
        let mut h = History::default();
        h.push(op(1, two, 0, 10));
        h.push(op(2, two, 5, 15));
        // Starts as the first ends: still two.
        h.push(op(3, two, 10, 20));
        let r = h.check();
        assert_eq!((r.violations(), r.max_holders), (0, 2), "{r}");
        h.push(op(4, two, 12, 13));
        h.push(op(5, two, 12, 13));
        let r = h.check();
        assert_eq!(r.excess.len(), 1, "{r}");
        assert_eq!((r.excess[0].holders, r.excess[0].at), (4, ms(12)));
        assert_eq!(r.violations(), 1);
        // Another semaphore's holders, and exclusive kinds, do not count.
        let mut h = History::default();
        h.push(op(1, two, 0, 10));
        h.push(op(2, Kind::Mutex, 0, 10));
        let mut other = op(3, two, 0, 10);
        other.key = b"other".to_vec();
        h.push(other);
        h.push(op(4, two, 0, 10));
        assert_eq!(h.check().violations(), 0);
    }

    #[test]
    fn fencing_tokens_must_increase_in_grant_order() {
        let mut h = History::default();
        for (i, fence) in [3, 5, 4].into_iter().enumerate() {
            let mut o = op(i as u64, Kind::Mutex, 10 * i as u64, 10 * i as u64 + 5);
            o.fence = Some(fence);
            h.push(o);
        }
        let r = h.check();
        assert_eq!(r.fencing_violations, 1);
        assert!(r.to_string().contains("1 fencing violations"), "{r}");
    }
}
