//! An exhaustive model of the handshake pair: every interleaving of message deliveries, both
//! sides' timers (each may fire at any step, late or never: a stalled side), the drivers'
//! decisions (accept or decline, confirm or decline, commit or a failed link) and the closes of
//! the channel, explored to the end. In every end state both sides agree (SMC on both or on
//! neither), and a client that confirmed ends on TCP only when the server said so (a Decline)
//! or closed the channel without a final word (which it sends before any close, so it never
//! committed): never on its own clock.

use std::collections::{HashSet, VecDeque};
use std::time::{Duration, Instant};

use super::*;
use crate::proto::clc::ShmLinkInfo;

#[derive(Debug, Clone)]
enum Msg {
    Bytes(Vec<u8>),
    /// The sender closed the channel.
    Eof,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Act {
    ToServer,
    ToClient,
    ClientTimer,
    ServerTimer,
    ClientConfirms,
    ClientDeclines,
    ServerAccepts,
    ServerDeclines,
    ServerCommits,
    ServerLinkFails,
    ClientCloses,
    ServerCloses,
}

const ACTS: [Act; 12] = [
    Act::ToServer,
    Act::ToClient,
    Act::ClientTimer,
    Act::ServerTimer,
    Act::ClientConfirms,
    Act::ClientDeclines,
    Act::ServerAccepts,
    Act::ServerDeclines,
    Act::ServerCommits,
    Act::ServerLinkFails,
    Act::ClientCloses,
    Act::ServerCloses,
];

/// Feeds a message to a machine as a driver does (only what it wants; the rest of a message a
/// finished machine does not want is dropped).
macro_rules! feed {
    ($m:expr, $bytes:expr, $now:expr) => {{
        let bytes: &[u8] = &$bytes;
        let mut at = 0;
        while $m.wanted() > 0 && at < bytes.len() {
            at += $m.handle_input(&bytes[at..], $now);
        }
    }};
}

fn shm(slot: u32) -> LinkInfo {
    LinkInfo::Shm(ShmLinkInfo { link_group: 1, rmb_slot: slot, rmb_size: 4096, socket_name: vec![] })
}

/// Both machines, the two directions of the channel, the events the drivers still have to act
/// on, and the model's clock (which moves only when a timer fires).
struct World {
    start: Instant,
    now: Instant,
    c: ClientHandshake,
    s: ServerHandshake,
    to_s: VecDeque<Msg>,
    to_c: VecDeque<Msg>,
    c_event: Option<ClientEvent>,
    s_event: Option<ServerEvent>,
    c_closed: bool,
    s_closed: bool,
    confirmed: bool,
}

impl World {
    fn new() -> World {
        let start = Instant::now();
        let timeouts = Timeouts::uniform(Duration::from_secs(2));
        let proposal = Proposal {
            secret: Secret([0x42; 16]),
            rmb_size: 0,
            shm: Some(crate::proto::clc::ShmOffer { link_group: 0 }),
            rdma: None,
        };
        let mut w = World {
            start,
            now: start,
            c: ClientHandshake::new(proposal, start, timeouts).unwrap(),
            s: ServerHandshake::new(start, timeouts),
            to_s: VecDeque::new(),
            to_c: VecDeque::new(),
            c_event: None,
            s_event: None,
            c_closed: false,
            s_closed: false,
            confirmed: false,
        };
        w.pump();
        w
    }

    /// Moves what the machines have to send onto the channel, and their events to the drivers.
    fn pump(&mut self) {
        while let Some(b) = self.c.poll_transmit() {
            if !self.c_closed {
                self.to_s.push_back(Msg::Bytes(b));
            }
        }
        while let Some(b) = self.s.poll_transmit() {
            if !self.s_closed {
                self.to_c.push_back(Msg::Bytes(b));
            }
        }
        if let Some(e) = self.c.poll_event() {
            assert!(self.c_event.is_none(), "a second client event before the first was handled");
            self.c_event = Some(e);
        }
        if let Some(e) = self.s.poll_event() {
            assert!(self.s_event.is_none(), "a second server event before the first was handled");
            self.s_event = Some(e);
        }
    }

    fn enabled(&self, a: Act) -> bool {
        match a {
            Act::ToServer => !self.to_s.is_empty(),
            Act::ToClient => !self.to_c.is_empty(),
            Act::ClientTimer => !self.c.is_done() && self.c.poll_timeout().is_some(),
            Act::ServerTimer => !self.s.is_done() && self.s.poll_timeout().is_some(),
            Act::ClientConfirms | Act::ClientDeclines => matches!(self.c_event, Some(ClientEvent::Accepted(_))),
            Act::ServerAccepts | Act::ServerDeclines => matches!(self.s_event, Some(ServerEvent::Proposal(_))),
            Act::ServerCommits | Act::ServerLinkFails => matches!(self.s_event, Some(ServerEvent::Confirmed(_))),
            // A side closes the channel once its machine is done and everything it sent is
            // on the way (the door's drivers close after the last message).
            Act::ClientCloses => self.c.is_done() && !self.c_closed,
            Act::ServerCloses => self.s.is_done() && !self.s_closed,
        }
    }

    fn apply(&mut self, a: Act) {
        let now = self.now;
        match a {
            Act::ToServer => match self.to_s.pop_front() {
                Some(Msg::Bytes(b)) => feed!(self.s, b, now),
                Some(Msg::Eof) => {
                    self.s.handle_input(&[], now);
                }
                None => unreachable!(),
            },
            Act::ToClient => match self.to_c.pop_front() {
                Some(Msg::Bytes(b)) => feed!(self.c, b, now),
                Some(Msg::Eof) => {
                    self.c.handle_input(&[], now);
                }
                None => unreachable!(),
            },
            Act::ClientTimer => {
                self.now = self.now.max(self.c.poll_timeout().unwrap());
                self.c.handle_timeout(self.now);
            }
            Act::ServerTimer => {
                self.now = self.now.max(self.s.poll_timeout().unwrap());
                self.s.handle_timeout(self.now);
            }
            Act::ClientConfirms => {
                self.c_event = None;
                self.c.confirm(shm(2), now);
                self.confirmed = self.c.has_confirmed();
            }
            Act::ClientDeclines => {
                self.c_event = None;
                self.c.decline(DeclineReason::Internal, now);
            }
            Act::ServerAccepts => {
                self.s_event = None;
                self.s.accept(shm(1), now);
            }
            Act::ServerDeclines => {
                self.s_event = None;
                self.s.decline(DeclineReason::NoCommonTransport, now);
            }
            Act::ServerCommits => {
                self.s_event = None;
                self.s.commit(now);
            }
            Act::ServerLinkFails => {
                self.s_event = None;
                self.s.decline(DeclineReason::Internal, now);
            }
            Act::ClientCloses => {
                self.c_closed = true;
                self.to_s.push_back(Msg::Eof);
            }
            Act::ServerCloses => {
                self.s_closed = true;
                self.to_c.push_back(Msg::Eof);
            }
        }
        self.pump();
    }

    /// What identifies the state (the clock as an offset from the start).
    fn key(&self) -> String {
        format!(
            "{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{}{}{}|{:?}",
            self.c,
            self.s,
            self.to_s,
            self.to_c,
            self.c_event,
            self.s_event,
            self.c_closed,
            self.s_closed,
            self.confirmed,
            self.now - self.start
        )
    }

    /// The end-state properties.
    fn check_end(&self, path: &[Act]) {
        let (Some(c), Some(s)) = (self.c.outcome(), self.s.outcome()) else {
            panic!("an end state with a side still undecided: {path:?}\nclient {:?}\nserver {:?}", self.c, self.s);
        };
        // What the driver asks to choose between TCP and an error stays true once confirmed.
        assert_eq!(self.c.has_confirmed(), self.confirmed, "has_confirmed changed after the end: {path:?}");
        let smc = |o: &Outcome| matches!(o, Outcome::Smc { .. });
        // The one end that is not an agreement: a client that confirmed and then heard nothing
        // for the final-word bound (a minute at least; the server made no progress at all)
        // fails the connection, which its driver reports as an error, never as TCP.
        let gave_up = self.confirmed && matches!(c, Outcome::Failed(HandshakeError::Timeout));
        if !gave_up {
            assert_eq!(smc(c), smc(s), "the sides disagree: client {c:?}, server {s:?} after {path:?}");
        }
        if self.confirmed && !smc(c) && !gave_up {
            assert!(
                matches!(c, Outcome::Fallback { by: Side::Peer, .. } | Outcome::Failed(HandshakeError::Eof)),
                "a client that confirmed left on its own: {c:?} after {path:?}"
            );
        }
        if gave_up {
            assert!(
                self.now - self.start >= FINAL_WORD_FLOOR,
                "a confirmed client gave up before the final-word bound: {path:?}"
            );
        }
    }
}

/// Replays `path` on a fresh world.
fn replay(path: &[Act]) -> World {
    let mut w = World::new();
    for &a in path {
        w.apply(a);
    }
    w
}

/// Every reachable state, depth first (by replay: the machines are not `Clone`); returns the
/// number of distinct states and of end states.
fn explore() -> (usize, usize) {
    let mut seen = HashSet::new();
    let mut ends = 0;
    let mut stack: Vec<Vec<Act>> = vec![Vec::new()];
    while let Some(path) = stack.pop() {
        let w = replay(&path);
        if !seen.insert(w.key()) {
            continue;
        }
        let next: Vec<Act> = ACTS.iter().copied().filter(|&a| w.enabled(a)).collect();
        if next.is_empty() {
            w.check_end(&path);
            ends += 1;
            continue;
        }
        assert!(path.len() < 64, "a path that does not end: {path:?}");
        for a in next {
            let mut p = path.clone();
            p.push(a);
            stack.push(p);
        }
    }
    (seen.len(), ends)
}

#[test]
fn both_sides_agree_under_every_interleaving_of_messages_timers_and_decisions() {
    let (states, ends) = explore();
    eprintln!("handshake model: {states} states, {ends} end states");
    // The model is not trivially small (a guard against a harness that explores nothing).
    assert!(states > 1000 && ends > 10, "{states} states, {ends} end states");
}
