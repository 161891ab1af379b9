//! Entry points for the fuzz targets in `fuzz/` (feature `fuzzing`; not a stable API). Each
//! takes arbitrary bytes, drives one decoder or state machine with them, and panics only when an
//! invariant breaks; any other panic is a bug the fuzzer reports.

use std::time::{Duration, Instant};

use crate::link::shm::region::{CdcRx, Layout, RegionView};
use crate::proto::cdc::{CdcMsg, CDC_MSG_LEN};
use crate::proto::clc::{decode, ClcMessage, DeclineReason, Decoded, LinkInfo, ShmLinkInfo};
use crate::proto::cursor::RingSize;
use crate::proto::door::{DoorFrame, DOOR_HEADER_LEN};
use crate::proto::engine::ConnEngine;
use crate::proto::handshake::{ClientEvent, ClientHandshake, ServerEvent, ServerHandshake, Timeouts};
use crate::proto::side::{Join, Ready, Welcome};

/// CLC decoding: never panics; whatever decodes re-encodes and decodes to itself.
///
/// # Examples
///
/// ```
/// use smc_tokio::proto::clc::{ClcMessage, Decline, DeclineReason, Secret};
///
/// // A whole message, a truncated one and noise: each call returns.
/// let msg = ClcMessage::Decline(Decline { secret: Secret([7; 16]), reason: DeclineReason::Timeout });
/// let bytes = msg.encode().unwrap();
/// smc_tokio::fuzzing::clc_decode(&bytes);
/// smc_tokio::fuzzing::clc_decode(&bytes[..bytes.len() - 1]);
/// smc_tokio::fuzzing::clc_decode(b"\xE2\xD4\xC3\xE3 not a header");
/// ```
pub fn clc_decode(data: &[u8]) {
    match decode(data) {
        Ok(Decoded::Message(m, n)) => {
            assert!(n <= data.len());
            let again = m.encode().expect("a decoded message encodes");
            assert_eq!(decode(&again), Ok(Decoded::Message(m, again.len())));
        }
        Ok(Decoded::NeedMore(n)) => assert!(n > data.len()),
        Err(_) => {}
    }
}

/// CDC decoding of 64-byte frames: never panics; decoded inline payloads fit.
///
/// # Examples
///
/// ```
/// use smc_tokio::proto::cdc::CdcMsg;
///
/// // Two frames back to back: a valid one, then one of noise (rejected, not a panic).
/// let mut data = CdcMsg::new(1, 42).encode().to_vec();
/// data.extend_from_slice(&[0xA5; 64]);
/// smc_tokio::fuzzing::cdc_decode(&data);
/// ```
pub fn cdc_decode(data: &[u8]) {
    for chunk in data.chunks_exact(CDC_MSG_LEN) {
        let frame: [u8; CDC_MSG_LEN] = chunk.try_into().unwrap_or([0; CDC_MSG_LEN]);
        if let Ok(m) = CdcMsg::decode(&frame) {
            assert!(m.inline().len() <= crate::proto::cdc::CDC_INLINE_MAX);
            assert_eq!(CdcMsg::decode(&m.encode()), Ok(m));
        }
    }
}

/// Whether `again` (a decoded message encoded again) is `data` but for the bytes at offsets
/// `ignored` holds for, which are zero in `again` (the decoder ignores them, the encoder writes
/// zeros).
fn same_but_ignored(again: &[u8], data: &[u8], ignored: impl Fn(usize) -> bool) -> bool {
    again.len() == data.len()
        && again.iter().zip(data).enumerate().all(|(i, (a, d))| if ignored(i) { *a == 0 } else { a == d })
}

/// Door message decoding (one input is one message): never panics; a message that splits
/// into frames ([`frames`](crate::proto::door::frames)) has 1 to 64 of them within its bound,
/// and every frame has a payload that fits, re-encodes to the same bytes (its spare byte as
/// zero) and decodes to itself, as do a Register's head and Proposal and a Connected frame's
/// tuple; the frames re-encoded back to back are the message. A message of one frame decodes
/// the same through [`DoorFrame::decode`], and one of more is refused there.
///
/// # Examples
///
/// ```
/// use smc_tokio::proto::door::{DoorFrame, DoorKind, RegisterHead};
///
/// // A registration, the same truncated into its header, noise, and two frames in one message:
/// // each call returns.
/// let mut bytes = RegisterHead { instance: 42, cookie: 7, port: 40_000 }.encode_frame(1, b"a proposal");
/// smc_tokio::fuzzing::door_decode(&bytes);
/// smc_tokio::fuzzing::door_decode(&bytes[..10]);
/// smc_tokio::fuzzing::door_decode(b"SMCd\x04\x09 not a frame");
/// DoorFrame { kind: DoorKind::Cancel, reason: 0, id: 1 }.encode_into(&mut bytes, &[]);
/// smc_tokio::fuzzing::door_decode(&bytes);
/// ```
pub fn door_decode(data: &[u8]) {
    use crate::proto::door::{frames, ConnectedTuple, DoorKind, RegisterHead, DOOR_BATCH_FRAMES, DOOR_MSG_MAX};
    let Ok(all) = frames(data) else {
        assert!(DoorFrame::decode(data).is_err(), "one frame taken where its message is refused");
        return;
    };
    assert!(data.len() <= DOOR_MSG_MAX);
    let mut again = Vec::new();
    let mut count = 0;
    let mut at = 0;
    for (frame, payload) in all {
        count += 1;
        let whole = &data[at..at + DOOR_HEADER_LEN + payload.len()];
        assert!(payload.len() <= crate::proto::door::DOOR_FRAME_MAX - DOOR_HEADER_LEN);
        assert_eq!(payload, &whole[DOOR_HEADER_LEN..]);
        assert_eq!(frame.kind.has_payload(), !payload.is_empty());
        let one = frame.encode(payload);
        assert!(same_but_ignored(&one, whole, |i| i == 7), "re-encoded differently");
        assert_eq!(DoorFrame::decode(&one), Ok((frame, payload)));
        if frame.kind == DoorKind::Connected {
            if let Ok((t, clc)) = ConnectedTuple::decode(payload) {
                assert!(!clc.is_empty() && clc.len() <= crate::proto::clc::CLC_MAX_LEN);
                let re = t.encode_frame(frame.id, clc);
                let (_, p2) = DoorFrame::decode(&re).expect("a connected frame re-encodes");
                assert_eq!(ConnectedTuple::decode(p2), Ok((t, clc)));
            }
        }
        if frame.kind == DoorKind::Register {
            if let Ok((head, proposal)) = RegisterHead::decode(payload) {
                assert!(!proposal.is_empty() && proposal.len() <= crate::proto::clc::CLC_MAX_LEN);
                // A Register carries no reason: what its byte holds is ignored (only the head
                // and the Proposal are re-encoded here).
                let re = head.encode_frame(frame.id, proposal);
                let mut whole = whole.to_vec();
                whole[6] = 0;
                assert!(same_but_ignored(&re, &whole, |i| i == 7), "registration re-encoded differently");
            }
        }
        frame.encode_into(&mut again, payload);
        at += whole.len();
    }
    assert!((1..=DOOR_BATCH_FRAMES).contains(&count));
    assert_eq!(at, data.len(), "bytes after the last frame");
    let spare = |i: usize| {
        // The spare byte of each frame, found by walking the re-encoded frames.
        let mut start = 0;
        while start + DOOR_HEADER_LEN <= again.len() {
            if i == start + 7 {
                return true;
            }
            let len = usize::from(u16::from_be_bytes([again[start + 16], again[start + 17]]));
            start += DOOR_HEADER_LEN + len;
        }
        false
    };
    assert!(same_but_ignored(&again, data, spare), "frames re-encoded back to back differ from the message");
    assert_eq!(DoorFrame::decode(data).is_ok(), count == 1);
}

/// Side-channel decoding (one input is one message, read as a JOIN, a WELCOME and a READY):
/// never panics; a message that decodes re-encodes to the same bytes (its reserved bytes as
/// zeros) and decodes to itself; no message is two of them.
///
/// # Examples
///
/// ```
/// use smc_tokio::proto::clc::Secret;
/// use smc_tokio::proto::side::{BellTag, Join, Ready, Welcome};
///
/// // A JOIN, a WELCOME, a READY, a short message and noise: each call returns.
/// let join = Join { link_group: 7, secret: Secret([1; 16]), bell: BellTag([2; 24]) }.encode();
/// smc_tokio::fuzzing::side_decode(&join);
/// smc_tokio::fuzzing::side_decode(&Welcome::accepted(7, BellTag([3; 24])).encode());
/// smc_tokio::fuzzing::side_decode(&Ready.encode());
/// smc_tokio::fuzzing::side_decode(&join[..40]);
/// smc_tokio::fuzzing::side_decode(&[0xA5; 64]);
/// ```
pub fn side_decode(data: &[u8]) {
    if let Ok(join) = Join::decode(data) {
        let again = join.encode();
        assert!(same_but_ignored(&again, data, |i| (12..16).contains(&i)), "join re-encoded differently");
        assert_eq!(Join::decode(&again), Ok(join));
    }
    if let Ok(welcome) = Welcome::decode(data) {
        let again = welcome.encode();
        assert!(same_but_ignored(&again, data, |i| (24..40).contains(&i)), "welcome re-encoded differently");
        assert_eq!(Welcome::decode(&again), Ok(welcome));
        assert_eq!(welcome.is_accepted(), welcome.status == crate::proto::side::WELCOME_OK);
    }
    if Ready::decode(data).is_ok() {
        assert_eq!(Ready::decode(&Ready.encode()), Ok(Ready));
        assert!(same_but_ignored(&Ready.encode(), data, |i| i >= 12), "ready re-encoded differently");
    }
    // A message is one of them at most.
    let kinds = [Join::decode(data).is_ok(), Welcome::decode(data).is_ok(), Ready::decode(data).is_ok()];
    assert!(kinds.iter().filter(|k| **k).count() <= 1);
}

/// Drives one side's [`Handback`](crate::proto::handback::Handback) with arbitrary bytes as the
/// peer's part of the TCP stream: the first eight bytes choose what this side wrote and had
/// acknowledged, the rest arrive in steps. Checks that it never takes more than the frame
/// wants, that a frame it accepts re-encodes to the bytes it read, and that what it resends
/// lies inside what it wrote and had not seen acknowledged.
///
/// # Examples
///
/// ```
/// use smc_tokio::proto::handback::HandbackFrame;
///
/// let mut input = vec![0, 0, 0, 40, 0, 0, 0, 10, 16];
/// input.extend_from_slice(&HandbackFrame { consumed: 25 }.encode());
/// smc_tokio::fuzzing::handback_decode(&input);
/// smc_tokio::fuzzing::handback_decode(&[1, 2, 3]);
/// ```
pub fn handback_decode(data: &[u8]) {
    use crate::proto::handback::{Handback, HandbackFrame, HANDBACK_FRAME_LEN};
    if data.len() < 8 {
        return;
    }
    let written = u64::from(u32::from_be_bytes([data[0], data[1], data[2], data[3]]));
    let acknowledged = u64::from(u32::from_be_bytes([data[4], data[5], data[6], data[7]])).min(written);
    let mut h = Handback::new(0, acknowledged, written, data[0] & 1 == 1);
    h.frame_written(HANDBACK_FRAME_LEN);
    let mut frame = Vec::new();
    for step in steps(&data[8..]) {
        let want = h.peer_frame_wanted();
        match h.on_peer_bytes(step) {
            Ok(n) => {
                assert!(n <= want && n <= step.len(), "took more than the frame wants");
                frame.extend_from_slice(&step[..n]);
            }
            Err(_) => return,
        }
    }
    if h.peer_frame_read() {
        let f = HandbackFrame::decode(frame.as_slice().try_into().expect("a whole frame")).expect("it was accepted");
        assert_eq!(f.encode().as_slice(), frame.as_slice(), "an accepted frame re-encodes as read");
        if let Some((from, to)) = h.resend() {
            assert!(acknowledged <= from && from < to && to == written, "resend outside the copy");
        }
    }
}

/// Splits `data` into (chunk size, bytes) steps: the first byte of each step is its length.
/// The length of the whole CLC message `data` starts with, if it does: a handshake takes such a
/// message at once, past what it said it wanted (its header).
fn whole_message(data: &[u8]) -> Option<usize> {
    match crate::proto::clc::decode(data) {
        Ok(crate::proto::clc::Decoded::Message(_, n)) => Some(n),
        _ => None,
    }
}

fn steps(mut data: &[u8]) -> impl Iterator<Item = &[u8]> {
    std::iter::from_fn(move || {
        let (&n, rest) = data.split_first()?;
        let k = usize::from(n % 64).max(1).min(rest.len());
        let (step, tail) = rest.split_at(k);
        data = tail;
        Some(step)
    })
}

fn shm_link(slot: u32) -> LinkInfo {
    LinkInfo::Shm(ShmLinkInfo { link_group: 1, rmb_slot: slot, rmb_size: 4096, socket_name: b"fuzz".to_vec() })
}

/// The server's handshake fed an arbitrary byte stream in arbitrary pieces, with decisions and
/// timeouts taken from the bytes: never panics, never reads more than it wants, always ends
/// or keeps a deadline.
///
/// # Examples
///
/// ```
/// use smc_tokio::proto::clc::{ClcMessage, Proposal, Secret};
///
/// // The seed corpus starts from real messages; any other input must be survived as well.
/// let proposal = Proposal { secret: Secret([1; 16]), rmb_size: 4096, shm: None, rdma: None };
/// smc_tokio::fuzzing::handshake_server(&ClcMessage::Proposal(proposal).encode().unwrap());
/// smc_tokio::fuzzing::handshake_server(&[]);
/// smc_tokio::fuzzing::handshake_server(&[0xFF; 300]);
/// ```
pub fn handshake_server(data: &[u8]) {
    let t0 = Instant::now();
    let mut hs = ServerHandshake::new(t0, Timeouts::uniform(Duration::from_secs(1)));
    for step in steps(data) {
        let want = hs.wanted();
        let used = hs.handle_input(step, t0);
        assert!(
            used <= want || whole_message(step) == Some(used),
            "took {used} of {} bytes, wanted {want}",
            step.len()
        );
        // An empty step is EOF (the peer closed), a real input; the control byte is then 0.
        let ctl = step.first().copied().unwrap_or(0);
        match hs.poll_event() {
            Some(ServerEvent::Proposal(_)) if ctl & 1 == 0 => hs.accept(shm_link(7), t0),
            Some(ServerEvent::Proposal(_)) => hs.decline(DeclineReason::NoCommonTransport, t0),
            Some(ServerEvent::Confirmed(_)) if ctl & 2 == 0 => hs.commit(t0),
            Some(ServerEvent::Confirmed(_)) => hs.decline(DeclineReason::SyncError, t0),
            None => {}
        }
        let _ = hs.poll_transmit();
        if ctl == 0xFF {
            hs.handle_timeout(t0 + Duration::from_secs(2));
        }
        if hs.outcome().is_some() {
            assert_eq!(hs.wanted(), 0);
            assert!(hs.poll_timeout().is_none());
            return;
        }
        assert!(hs.poll_timeout().is_some());
    }
}

/// The client's handshake fed an arbitrary reply stream: the same properties.
///
/// # Examples
///
/// ```
/// // The first byte also picks a well-formed Accept (even) or Decline (odd) to start the
/// // replies with, so that the later states are reached.
/// smc_tokio::fuzzing::handshake_client(&[0x00, 0x10, 0x20]);
/// smc_tokio::fuzzing::handshake_client(&[0x01; 100]);
/// ```
pub fn handshake_client(data: &[u8]) {
    let t0 = Instant::now();
    let secret = crate::proto::clc::Secret([3; 16]);
    let proposal = crate::proto::clc::Proposal { secret, rmb_size: 4096, shm: None, rdma: None };
    let Ok(mut hs) = ClientHandshake::new(proposal, t0, Timeouts::uniform(Duration::from_secs(1))) else { return };
    let _ = hs.poll_transmit();
    // Sometimes start with a well-formed Accept or Decline so the later states are reached.
    let mut prefix = Vec::new();
    if let Some(&b) = data.first() {
        let m = if b & 1 == 0 {
            ClcMessage::Accept(crate::proto::clc::Accept { secret, link: shm_link(u32::from(b)) })
        } else {
            ClcMessage::Decline(crate::proto::clc::Decline { secret, reason: DeclineReason::Timeout })
        };
        if b & 2 == 0 {
            prefix = m.encode().unwrap_or_default();
        }
    }
    let stream: Vec<u8> = prefix.into_iter().chain(data.iter().copied()).collect();
    for step in steps(&stream) {
        let want = hs.wanted();
        let used = hs.handle_input(step, t0);
        assert!(
            used <= want || whole_message(step) == Some(used),
            "took {used} of {} bytes, wanted {want}",
            step.len()
        );
        let ctl = step.first().copied().unwrap_or(0);
        if let Some(ClientEvent::Accepted(_)) = hs.poll_event() {
            if ctl & 1 == 0 {
                hs.confirm(shm_link(9), t0);
            } else {
                hs.decline(DeclineReason::Internal, t0);
            }
        }
        let _ = hs.poll_transmit();
        if ctl == 0xFF {
            hs.handle_timeout(t0 + Duration::from_secs(2));
        }
        if hs.outcome().is_some() {
            assert_eq!(hs.wanted(), 0);
            assert!(hs.poll_timeout().is_none());
            return;
        }
        assert!(hs.poll_timeout().is_some());
    }
}

/// The receive path over an arbitrary peer region: the bytes are the peer's shared memory
/// (header, counters, CDC frames), read through the same code as a real link, and the frames
/// that decode are fed to a connection engine. Nothing may panic or go out of bounds; the
/// engine's counts stay within its rings.
///
/// # Examples
///
/// ```
/// // A region of zeros (no frames) and one of noise: the receive path survives both.
/// smc_tokio::fuzzing::shm_rx(&[0; 8192]);
/// smc_tokio::fuzzing::shm_rx(&[0xFF; 8192]);
/// ```
pub fn shm_rx(data: &[u8]) {
    // A fixed small layout; the region's first page (header and counters) and CDC ring come
    // from the input, the rest is zero.
    let Some(layout) = Layout::new(8, 2, 4096) else { return };
    let mut buf = vec![AlignedLine([0; 64]); layout.total_len.div_ceil(64)];
    let n = data.len().min(layout.total_len);
    for (i, b) in data[..n].iter().enumerate() {
        buf[i / 64].0[i % 64] = *b;
    }
    // Header parsing against the real length must never panic, whatever the header says.
    // SAFETY: the buffer is 64-aligned and at least one line long.
    let header = unsafe { RegionView::read_header(buf.as_ptr().cast()) };
    let _ = Layout::parse(header, (buf.len() * 64) as u64);
    let mut ours_buf = vec![AlignedLine([0; 64]); layout.total_len.div_ceil(64)];
    // SAFETY: both buffers are 64-aligned, hold `total_len` bytes, and outlive the views.
    let (peer, ours) = unsafe {
        (RegionView::new(buf.as_mut_ptr().cast(), layout), RegionView::new(ours_buf.as_mut_ptr().cast(), layout))
    };
    let mut rx = CdcRx::new();
    let Some(ring) = RingSize::new(4096) else { return };
    let mut engine = ConnEngine::new(1, ring, ring);
    // Our side writes too, with a ring that starts over when the peer's cursors say it may:
    // whatever the peer reports, we never write where it has not read.
    engine.set_tx_restart(Some(64));
    let mut frames = Vec::new();
    for _ in 0..4 {
        let k = engine.tx_free().min(100);
        let _ = engine.tx_commit(k);
        if let Some(m) = engine.poll_cdc() {
            engine.on_cdc_sent(&m);
        }
        frames.clear();
        rx.pop(&ours, &peer, 64, &mut frames);
        for f in &frames {
            if let Ok(m) = CdcMsg::decode(f) {
                if engine.on_cdc(&m).is_ok() {
                    assert!(engine.rx_available() <= ring.get());
                    let k = engine.rx_available() / 2;
                    let _ = engine.rx_consume(k);
                }
            }
        }
        let _ = rx.arm(&ours, &peer, false);
        assert!(engine.tx_in_flight() <= ring.get());
    }
    assert!(engine.tx_free() <= ring.get());
}

#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct AlignedLine([u8; 64]);

/// The copy the receive paths use on peer memory (`rep movsb` for long copies on x86-64, relaxed
/// word loads otherwise), from `src` into `dst` (the shorter length); with `words`, the word
/// loop whatever the length. For the benchmark of the two, `benches/benches/peer_copy.rs`.
///
/// # Examples
///
/// ```
/// let src: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
/// let mut dst = vec![0u8; 5000];
/// smc_tokio::fuzzing::peer_copy(&src, &mut dst, false);
/// assert_eq!(src, dst);
/// smc_tokio::fuzzing::peer_copy(&src[3..], &mut dst[..4997], true);
/// assert_eq!(&src[3..], &dst[..4997]);
/// ```
pub fn peer_copy(src: &[u8], dst: &mut [u8], words: bool) {
    let n = src.len().min(dst.len());
    // SAFETY: a `u8` slice is a valid `MaybeUninit<u8>` slice of the same length (it is only
    // written with initialised bytes).
    let out = unsafe { &mut *(std::ptr::from_mut(&mut dst[..n]) as *mut [std::mem::MaybeUninit<u8>]) };
    // SAFETY: `src` is readable for `n` bytes and does not overlap `dst` (distinct borrows).
    unsafe {
        if words {
            crate::link::peer_mem::copy_from_peer_words(src.as_ptr(), out);
        } else {
            crate::link::peer_mem::copy_from_peer(src.as_ptr(), out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fuzz entry points run on their seed corpus (and a few crafted inputs) as unit tests,
    /// so a regression shows up in `cargo test` too.
    #[test]
    fn entry_points_run_on_seeds() {
        let seeds_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
        let mut ran = 0;
        for (target, f) in [
            ("clc_decode", clc_decode as fn(&[u8])),
            ("cdc_decode", cdc_decode),
            ("door_decode", door_decode),
            ("side_decode", side_decode),
            ("handback_decode", handback_decode),
            ("handshake_server", handshake_server),
            ("handshake_client", handshake_client),
            ("shm_rx", shm_rx),
        ] {
            f(&[]);
            f(&[0xE2, 0xD4, 0xC3, 0xE3, 1, 1, 0, 12]);
            // Found by cargo fuzz (handshake_server): a step that is EOF.
            f(&[0x03]);
            if let Ok(dir) = std::fs::read_dir(seeds_dir.join(target)) {
                for e in dir.flatten() {
                    if let Ok(bytes) = std::fs::read(e.path()) {
                        f(&bytes);
                        ran += 1;
                    }
                }
            }
        }
        assert!(ran > 0, "the seed corpus under fuzz/corpus is missing");
    }

    fn rdma_link(qpn: u32) -> crate::proto::clc::LinkInfo {
        crate::proto::clc::LinkInfo::Rdma(crate::proto::clc::RdmaLinkInfo {
            gid: [2; 16],
            qpn,
            psn: 0xabcdef,
            mtu: 1024,
            rkey: 0x1234,
            rmb_addr: 0x7f00_0000_1000,
            rmb_size: 1 << 18,
            rmb_token: 0x0001_0003,
            link_group: 0xdead_beef,
        })
    }

    /// Writes the seed corpus (run with `--ignored` after changing the wire format).
    #[test]
    #[ignore]
    fn write_seed_corpus() {
        use crate::proto::clc::{Accept, Commit, Confirm, Decline, Proposal, Secret, ShmOffer};
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
        let secret = Secret([3; 16]);
        let msgs = [
            ClcMessage::Proposal(Proposal { secret, rmb_size: 4096, shm: None, rdma: None }),
            ClcMessage::Proposal(Proposal {
                secret,
                rmb_size: 1 << 18,
                shm: Some(ShmOffer { link_group: 0 }),
                rdma: None,
            }),
            ClcMessage::Accept(Accept { secret, link: shm_link(5) }),
            ClcMessage::Confirm(Confirm { secret, link: shm_link(6) }),
            ClcMessage::Decline(Decline { secret, reason: DeclineReason::HandshakeCongested }),
            ClcMessage::Proposal(Proposal {
                secret,
                rmb_size: 1 << 18,
                shm: None,
                rdma: Some(crate::proto::clc::RdmaOffer {
                    gid: [2; 16],
                    port: 1,
                    mtu: 1024,
                    qpn: 0x11,
                    link_group: 0xdead_beef,
                }),
            }),
            ClcMessage::Accept(Accept { secret, link: rdma_link(0x22) }),
            ClcMessage::Confirm(Confirm { secret, link: rdma_link(0x33) }),
            ClcMessage::Commit(Commit { secret }),
        ];
        let write = |target: &str, name: String, bytes: &[u8]| {
            let dir = root.join(target);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(name), bytes).unwrap();
        };
        for (i, m) in msgs.iter().enumerate() {
            let b = m.encode().unwrap();
            write("clc_decode", format!("msg{i}"), &b);
            write("handshake_server", format!("msg{i}"), &b);
            write("handshake_client", format!("msg{i}"), &b);
        }
        let mut m = CdcMsg::new(1, 2);
        m.prod = crate::proto::cursor::Cursor::new(0, 10);
        m.set_inline(b"0123456789").unwrap();
        write("cdc_decode", "frame0".into(), &m.encode());
        // A peer region with a valid header and two frames, each with its lap mark.
        let layout = Layout::new(8, 2, 4096).unwrap();
        let mut region = vec![AlignedLine([0; 64]); layout.total_len.div_ceil(64)];
        // SAFETY: aligned buffer of total_len bytes, alive for the view's use below.
        let v = unsafe { RegionView::new(region.as_mut_ptr().cast(), layout) };
        v.init_header();
        v.write_frame(0, &m.encode());
        let mut m2 = m;
        m2.seq = 2;
        m2.prod = crate::proto::cursor::Cursor::new(0, 20);
        m2.set_inline(b"").unwrap();
        v.write_frame(1, &m2.encode());
        let bytes: Vec<u8> = region.iter().flat_map(|l| l.0).take(4096 + 8 * 64).collect();
        write("shm_rx", "two_frames".into(), &bytes);
        // Door frames of every kind: a registration with its head and Proposal, the
        // handshake's CLC messages, both kinds of "no", and a cancel.
        use crate::proto::door::{DoorKind, RegisterHead};
        let proposal = msgs[1].encode().unwrap();
        let register = RegisterHead { instance: 0x0001_0002_0003_0004, cookie: 0x4000, port: 40_000 };
        let frames = [
            register.encode_frame(1, &proposal),
            DoorFrame { kind: DoorKind::Clc, reason: 0, id: 1 }.encode(&msgs[2].encode().unwrap()),
            DoorFrame { kind: DoorKind::Clc, reason: 0, id: 1 }.encode(&msgs[8].encode().unwrap()),
            DoorFrame { kind: DoorKind::Unmatched, reason: DeclineReason::HandshakeCongested as u8, id: 2 }.encode(&[]),
            DoorFrame { kind: DoorKind::Refused, reason: DeclineReason::NoCommonTransport as u8, id: 3 }.encode(&[]),
            DoorFrame { kind: DoorKind::Cancel, reason: 0, id: 4 }.encode(&[]),
            crate::proto::door::ConnectedTuple {
                local: "127.0.0.1:40000".parse().unwrap(),
                peer: "127.0.0.1:7777".parse().unwrap(),
            }
            .encode_frame(1, &msgs[3].encode().unwrap()),
        ];
        for (i, f) in frames.iter().enumerate() {
            write("door_decode", format!("frame{i}"), f);
        }
        // All of them in one message, as a turn's frames go out.
        write("door_decode", "batch".into(), &frames.concat());
        // A JOIN, a WELCOME that lets the client in, and one that refuses it.
        use crate::proto::side::JoinRefused;
        let bell = crate::proto::side::BellTag([0x5A; 24]);
        write("side_decode", "join".into(), &Join { link_group: 0xdead_beef, secret, bell }.encode());
        write("side_decode", "welcome".into(), &Welcome::accepted(0xdead_beef, bell).encode());
        write("side_decode", "refused".into(), &Welcome::refused(0xdead_beef, JoinRefused::UnknownGroup).encode());
        write("side_decode", "ready".into(), &Ready.encode());
        // One side's handback: 40 bytes written, 10 acknowledged; the peer's frame (consumed
        // 25) in a step of 16, and one that arrives byte by byte.
        let frame = crate::proto::handback::HandbackFrame { consumed: 25 }.encode();
        let mut whole = vec![0, 0, 0, 40, 0, 0, 0, 10, 16];
        whole.extend_from_slice(&frame);
        write("handback_decode", "frame".into(), &whole);
        let mut split = vec![0, 0, 0, 40, 0, 0, 0, 10];
        for b in frame {
            split.extend_from_slice(&[1, b]);
        }
        write("handback_decode", "frame_bytewise".into(), &split);
    }
}
