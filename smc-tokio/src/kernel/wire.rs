//! The kernel's netlink messages for SMC, encoded and decoded without I/O: the `smc_diag` dump
//! (`NETLINK_SOCK_DIAG`, family `AF_SMC`) and the `SMC_GEN_NETLINK` generic-netlink family's
//! handshake-limitation commands.
//!
//! Every value here comes from the kernel's UAPI headers (`linux/netlink.h`,
//! `linux/genetlink.h`, `linux/sock_diag.h`, `linux/inet_diag.h`, `linux/smc.h`,
//! `linux/smc_diag.h`); the test bed's `kabi.c` prints the same facts from the installed
//! headers and compares them with [`abi_report`] before any guest boots. Netlink integers are
//! in host byte order. Replies are untrusted input: every length is checked before use, and a
//! malformed reply is an error, never a panic.

use std::io;

/// `AF_SMC` (`linux/socket.h`).
pub(crate) const AF_SMC: i32 = 43;
/// `SMCPROTO_SMC`: `socket(AF_SMC, SOCK_STREAM, 0)` is SMC over IPv4 (`net/smc/smc.h`).
pub(crate) const SMCPROTO_SMC: i32 = 0;
/// `SMCPROTO_SMC6`: SMC over IPv6.
pub(crate) const SMCPROTO_SMC6: i32 = 1;
/// `SOL_SMC` (`linux/socket.h`).
pub(crate) const SOL_SMC: i32 = 286;
/// `SMC_LIMIT_HS` (`linux/smc.h`): an `int` on a listening socket, non-zero to fall back to TCP
/// when the listener's handshakes pile up.
pub(crate) const SMC_LIMIT_HS: i32 = 1;

/// `NETLINK_SOCK_DIAG` (`linux/netlink.h`).
pub(crate) const NETLINK_SOCK_DIAG: i32 = 4;
/// `SOCK_DIAG_BY_FAMILY` (`linux/sock_diag.h`).
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_MULTI: u16 = 0x2;
const NLM_F_ACK: u16 = 0x4;
/// `NLM_F_ROOT | NLM_F_MATCH`.
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_HDRLEN: usize = 16;
const NLA_HDRLEN: usize = 4;
/// `NLA_TYPE_MASK`: the attribute type without the nested and byte-order flags.
const NLA_TYPE_MASK: u16 = 0x3fff;

/// `sizeof(struct smc_diag_req)`: family, two pad bytes, the extension mask, then a 48-byte
/// `struct inet_diag_sockid`.
const SMC_DIAG_REQ_LEN: usize = 52;
/// `sizeof(struct smc_diag_msg)`: family, state, mode, shutdown, `inet_diag_sockid` (48),
/// uid (4), then the 8-byte-aligned inode at offset 56.
const SMC_DIAG_MSG_LEN: usize = 64;
const SMC_DIAG_MSG_INODE: usize = 56;
/// `SMC_DIAG_FALLBACK` (`linux/smc_diag.h`): the reply attribute with the kernel's fallback
/// reason and the peer's diagnosis (`__smc_diag_dump` adds it to every entry, unasked).
const SMC_DIAG_FALLBACK: u16 = 5;
/// `SMC_DIAG_MODE_*`.
const SMC_DIAG_MODE_SMCR: u8 = 0;
const SMC_DIAG_MODE_FALLBACK_TCP: u8 = 1;
const SMC_DIAG_MODE_SMCD: u8 = 2;

/// `GENL_ID_CTRL`, `CTRL_CMD_GETFAMILY`, `CTRL_ATTR_FAMILY_ID`, `CTRL_ATTR_FAMILY_NAME`
/// (`linux/genetlink.h`).
const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
const GENL_HDRLEN: usize = 4;
/// `SMC_GENL_FAMILY_NAME` and `SMC_GENL_FAMILY_VERSION` (`linux/smc.h`).
pub(crate) const SMC_GENL_FAMILY_NAME: &str = "SMC_GEN_NETLINK";
const SMC_GENL_FAMILY_VERSION: u8 = 1;
/// `SMC_NETLINK_DUMP_HS_LIMITATION`, `_ENABLE_`, `_DISABLE_` (`linux/smc.h`, commands 16-18).
const SMC_NETLINK_DUMP_HS_LIMITATION: u8 = 16;
const SMC_NETLINK_ENABLE_HS_LIMITATION: u8 = 17;
const SMC_NETLINK_DISABLE_HS_LIMITATION: u8 = 18;
/// `SMC_NLA_HS_LIMITATION_ENABLED`, a `u8` at the top level of the dump's reply.
const SMC_NLA_HS_LIMITATION_ENABLED: u16 = 1;

/// What `smc_diag` says of one `AF_SMC` socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DiagMode {
    /// The kernel moved the connection to SMC-R.
    SmcR,
    /// The kernel moved the connection to SMC-D.
    SmcD,
    /// The kernel kept the connection on TCP; the reason and the peer's diagnosis, when the
    /// kernel gave them (`SMC_DIAG_FALLBACK`).
    Fallback { reason: u32, peer_diagnosis: u32 },
    /// A mode value this code does not know (a newer kernel).
    Other(u8),
}

fn header(buf: &mut Vec<u8>, ty: u16, flags: u16, seq: u32) {
    // Length filled in by `finish`.
    buf.extend_from_slice(&0u32.to_ne_bytes());
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(&flags.to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    // Port id 0: to the kernel.
    buf.extend_from_slice(&0u32.to_ne_bytes());
}

fn finish(mut buf: Vec<u8>) -> Vec<u8> {
    let len = buf.len() as u32;
    buf[..4].copy_from_slice(&len.to_ne_bytes());
    buf
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

fn put_attr(buf: &mut Vec<u8>, ty: u16, data: &[u8]) {
    let len = NLA_HDRLEN + data.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(data);
    buf.resize(align4(buf.len()), 0);
}

/// A dump of every `AF_SMC` socket in the caller's network namespace, with the fallback
/// extension. (`smc_diag` does not filter by the request's socket id, so the caller picks its
/// socket out of the reply by inode.)
pub(crate) fn diag_request(seq: u32) -> Vec<u8> {
    let mut buf = Vec::with_capacity(NLMSG_HDRLEN + SMC_DIAG_REQ_LEN);
    header(&mut buf, SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, seq);
    let mut req = [0u8; SMC_DIAG_REQ_LEN];
    req[0] = AF_SMC as u8;
    // No extension bits (`diag_ext` 0): the fallback attribute comes with every entry, and
    // the connection and link group details are not needed.
    buf.extend_from_slice(&req);
    finish(buf)
}

/// A netlink reply that does not parse.
fn malformed(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("malformed netlink reply: {what}"))
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// One netlink message of a datagram: its type, flags and payload.
pub(crate) struct Msg<'a> {
    pub(crate) ty: u16,
    pub(crate) flags: u16,
    pub(crate) seq: u32,
    pub(crate) payload: &'a [u8],
}

/// The messages of one received datagram, each length checked.
pub(crate) fn messages(mut datagram: &[u8]) -> io::Result<Vec<Msg<'_>>> {
    let mut out = Vec::new();
    while !datagram.is_empty() {
        let len = u32_at(datagram, 0).ok_or_else(|| malformed("short header"))? as usize;
        if len < NLMSG_HDRLEN || len > datagram.len() {
            return Err(malformed("message length"));
        }
        let ty = u16_at(datagram, 4).ok_or_else(|| malformed("short header"))?;
        let flags = u16_at(datagram, 6).ok_or_else(|| malformed("short header"))?;
        let seq = u32_at(datagram, 8).ok_or_else(|| malformed("short header"))?;
        out.push(Msg { ty, flags, seq, payload: &datagram[NLMSG_HDRLEN..len] });
        datagram = datagram.get(align4(len)..).unwrap_or(&[]);
    }
    Ok(out)
}

/// What one message says to a request that waits for a dump or an acknowledgement.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Control {
    /// A data message (its payload is the caller's to decode).
    Data,
    /// The dump is complete.
    Done,
    /// An acknowledgement (error 0).
    Ack,
    /// The kernel refused the request with this errno.
    Error(i32),
}

/// Classifies a message of a reply.
pub(crate) fn control(m: &Msg<'_>) -> io::Result<Control> {
    match m.ty {
        NLMSG_DONE => Ok(Control::Done),
        NLMSG_ERROR => {
            let e = u32_at(m.payload, 0).ok_or_else(|| malformed("short error"))? as i32;
            Ok(if e == 0 { Control::Ack } else { Control::Error(-e) })
        }
        _ => Ok(Control::Data),
    }
}

/// The attributes in `b`: `(type, data)`, each length checked.
fn attrs(mut b: &[u8]) -> io::Result<Vec<(u16, &[u8])>> {
    let mut out = Vec::new();
    while b.len() >= NLA_HDRLEN {
        let len = u16_at(b, 0).ok_or_else(|| malformed("short attribute"))? as usize;
        let ty = u16_at(b, 2).ok_or_else(|| malformed("short attribute"))? & NLA_TYPE_MASK;
        if len < NLA_HDRLEN || len > b.len() {
            return Err(malformed("attribute length"));
        }
        out.push((ty, &b[NLA_HDRLEN..len]));
        b = b.get(align4(len)..).unwrap_or(&[]);
    }
    Ok(out)
}

/// Decodes one `smc_diag` dump message: the socket's inode and what the kernel made of it.
pub(crate) fn diag_entry(payload: &[u8]) -> io::Result<(u64, DiagMode)> {
    if payload.len() < SMC_DIAG_MSG_LEN {
        return Err(malformed("short smc_diag_msg"));
    }
    let inode = u64_at(payload, SMC_DIAG_MSG_INODE).ok_or_else(|| malformed("short smc_diag_msg"))?;
    let mode = match payload[2] {
        SMC_DIAG_MODE_SMCR => DiagMode::SmcR,
        SMC_DIAG_MODE_SMCD => DiagMode::SmcD,
        SMC_DIAG_MODE_FALLBACK_TCP => {
            let mut reason = 0;
            let mut peer_diagnosis = 0;
            for (ty, data) in attrs(&payload[SMC_DIAG_MSG_LEN..])? {
                if ty == SMC_DIAG_FALLBACK {
                    reason = u32_at(data, 0).ok_or_else(|| malformed("short smc_diag_fallback"))?;
                    peer_diagnosis = u32_at(data, 4).ok_or_else(|| malformed("short smc_diag_fallback"))?;
                }
            }
            DiagMode::Fallback { reason, peer_diagnosis }
        }
        other => DiagMode::Other(other),
    };
    Ok((inode, mode))
}

/// The `SOCK_DIAG_BY_FAMILY` message type, to tell dump entries from other messages.
pub(crate) fn is_diag_entry(m: &Msg<'_>) -> bool {
    m.ty == SOCK_DIAG_BY_FAMILY
}

fn genl_header(buf: &mut Vec<u8>, family: u16, flags: u16, seq: u32, cmd: u8, version: u8) {
    header(buf, family, flags, seq);
    buf.extend_from_slice(&[cmd, version, 0, 0]);
}

/// The generic-netlink controller's question: the id of the family called `name`.
pub(crate) fn genl_family_request(name: &str, seq: u32) -> Vec<u8> {
    let mut buf = Vec::with_capacity(64);
    genl_header(&mut buf, GENL_ID_CTRL, NLM_F_REQUEST, seq, CTRL_CMD_GETFAMILY, 1);
    let mut z = name.as_bytes().to_vec();
    z.push(0);
    put_attr(&mut buf, CTRL_ATTR_FAMILY_NAME, &z);
    finish(buf)
}

/// The data of the top-level attribute `ty` of a generic-netlink message's payload.
fn genl_attr(payload: &[u8], ty: u16) -> io::Result<Option<&[u8]>> {
    let body = payload.get(GENL_HDRLEN..).ok_or_else(|| malformed("short genl header"))?;
    Ok(attrs(body)?.into_iter().find(|(t, _)| *t == ty).map(|(_, d)| d))
}

/// The family id in the controller's answer.
pub(crate) fn genl_family_id(payload: &[u8]) -> io::Result<u16> {
    genl_attr(payload, CTRL_ATTR_FAMILY_ID)?.and_then(|d| u16_at(d, 0)).ok_or_else(|| malformed("no family id"))
}

/// Turns the kernel's global SMC handshake limitation on or off (acknowledged).
pub(crate) fn hs_limitation_set(family: u16, on: bool, seq: u32) -> Vec<u8> {
    let cmd = if on { SMC_NETLINK_ENABLE_HS_LIMITATION } else { SMC_NETLINK_DISABLE_HS_LIMITATION };
    let mut buf = Vec::with_capacity(NLMSG_HDRLEN + GENL_HDRLEN);
    genl_header(&mut buf, family, NLM_F_REQUEST | NLM_F_ACK, seq, cmd, SMC_GENL_FAMILY_VERSION);
    finish(buf)
}

/// Asks for the kernel's global SMC handshake limitation (a one-entry dump).
pub(crate) fn hs_limitation_get(family: u16, seq: u32) -> Vec<u8> {
    let mut buf = Vec::with_capacity(NLMSG_HDRLEN + GENL_HDRLEN);
    genl_header(
        &mut buf,
        family,
        NLM_F_REQUEST | NLM_F_DUMP,
        seq,
        SMC_NETLINK_DUMP_HS_LIMITATION,
        SMC_GENL_FAMILY_VERSION,
    );
    finish(buf)
}

/// The limitation's state in a dump entry.
pub(crate) fn hs_limitation_value(payload: &[u8]) -> io::Result<bool> {
    genl_attr(payload, SMC_NLA_HS_LIMITATION_ENABLED)?
        .and_then(|d| d.first().copied())
        .map(|v| v != 0)
        .ok_or_else(|| malformed("no SMC_NLA_HS_LIMITATION_ENABLED"))
}

/// Whether a message belongs to a multi-part reply (a dump), as opposed to a lone answer.
pub(crate) fn is_multi(m: &Msg<'_>) -> bool {
    m.flags & NLM_F_MULTI != 0
}

/// The layout facts this module assumes, one `name value` per line, in the format of the test
/// bed's `kabi.c`, which prints the same from the installed kernel headers.
pub fn abi_report() -> String {
    let facts: [(&str, i64); 20] = [
        ("AF_SMC", AF_SMC.into()),
        ("SMCPROTO_SMC", SMCPROTO_SMC.into()),
        ("SMCPROTO_SMC6", SMCPROTO_SMC6.into()),
        ("SOL_SMC", SOL_SMC.into()),
        ("SMC_LIMIT_HS", SMC_LIMIT_HS.into()),
        ("NETLINK_SOCK_DIAG", NETLINK_SOCK_DIAG.into()),
        ("SOCK_DIAG_BY_FAMILY", SOCK_DIAG_BY_FAMILY.into()),
        ("sizeof_smc_diag_req", SMC_DIAG_REQ_LEN as i64),
        ("sizeof_smc_diag_msg", SMC_DIAG_MSG_LEN as i64),
        ("offsetof_smc_diag_msg_diag_inode", SMC_DIAG_MSG_INODE as i64),
        ("SMC_DIAG_FALLBACK", SMC_DIAG_FALLBACK.into()),
        ("SMC_DIAG_MODE_SMCR", SMC_DIAG_MODE_SMCR.into()),
        ("SMC_DIAG_MODE_FALLBACK_TCP", SMC_DIAG_MODE_FALLBACK_TCP.into()),
        ("SMC_DIAG_MODE_SMCD", SMC_DIAG_MODE_SMCD.into()),
        ("SMC_GENL_FAMILY_VERSION", SMC_GENL_FAMILY_VERSION.into()),
        ("SMC_NETLINK_DUMP_HS_LIMITATION", SMC_NETLINK_DUMP_HS_LIMITATION.into()),
        ("SMC_NETLINK_ENABLE_HS_LIMITATION", SMC_NETLINK_ENABLE_HS_LIMITATION.into()),
        ("SMC_NETLINK_DISABLE_HS_LIMITATION", SMC_NETLINK_DISABLE_HS_LIMITATION.into()),
        ("SMC_NLA_HS_LIMITATION_ENABLED", SMC_NLA_HS_LIMITATION_ENABLED.into()),
        ("GENL_ID_CTRL", GENL_ID_CTRL.into()),
    ];
    let mut s = String::new();
    for (name, v) in facts {
        s.push_str(&format!("{name} {v}\n"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dump entry as the kernel lays it out (`__smc_diag_dump`), built field by field.
    fn entry(mode: u8, inode: u64, fallback: Option<(u32, u32)>) -> Vec<u8> {
        let mut p = vec![0u8; SMC_DIAG_MSG_LEN];
        p[0] = AF_SMC as u8;
        p[1] = 1; // state
        p[2] = mode;
        p[SMC_DIAG_MSG_INODE..SMC_DIAG_MSG_INODE + 8].copy_from_slice(&inode.to_ne_bytes());
        if let Some((r, d)) = fallback {
            let mut data = r.to_ne_bytes().to_vec();
            data.extend_from_slice(&d.to_ne_bytes());
            put_attr(&mut p, SMC_DIAG_FALLBACK, &data);
        }
        let mut m = Vec::new();
        header(&mut m, SOCK_DIAG_BY_FAMILY, NLM_F_MULTI, 7);
        m.extend_from_slice(&p);
        finish(m)
    }

    #[test]
    fn the_diag_request_dumps_af_smc() {
        let r = diag_request(9);
        assert_eq!(r.len(), NLMSG_HDRLEN + SMC_DIAG_REQ_LEN);
        let m = messages(&r).unwrap();
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].ty, SOCK_DIAG_BY_FAMILY);
        assert_eq!(m[0].flags, NLM_F_REQUEST | NLM_F_DUMP);
        assert_eq!(m[0].seq, 9);
        assert_eq!(m[0].payload[0], 43);
        assert_eq!(m[0].payload[3], 0);
    }

    #[test]
    fn dump_entries_decode_by_mode() {
        let mut d = entry(SMC_DIAG_MODE_SMCR, 11, None);
        d.extend(entry(SMC_DIAG_MODE_SMCD, 12, None));
        d.extend(entry(SMC_DIAG_MODE_FALLBACK_TCP, 13, Some((0x0500_0000, 0x0303_0008))));
        d.extend(entry(SMC_DIAG_MODE_FALLBACK_TCP, 14, None));
        d.extend(entry(9, 15, None));
        let mut done = Vec::new();
        header(&mut done, NLMSG_DONE, NLM_F_MULTI, 7);
        done.extend_from_slice(&0u32.to_ne_bytes());
        d.extend(finish(done));
        let msgs = messages(&d).unwrap();
        let got: Vec<_> = msgs.iter().filter(|m| is_diag_entry(m)).map(|m| diag_entry(m.payload).unwrap()).collect();
        assert_eq!(
            got,
            vec![
                (11, DiagMode::SmcR),
                (12, DiagMode::SmcD),
                (13, DiagMode::Fallback { reason: 0x0500_0000, peer_diagnosis: 0x0303_0008 }),
                (14, DiagMode::Fallback { reason: 0, peer_diagnosis: 0 }),
                (15, DiagMode::Other(9)),
            ]
        );
        assert_eq!(control(msgs.last().unwrap()).unwrap(), Control::Done);
        assert!(msgs.iter().all(is_multi));
    }

    #[test]
    fn malformed_replies_are_errors_not_panics() {
        let good = entry(SMC_DIAG_MODE_FALLBACK_TCP, 5, Some((1, 2)));
        // Every truncation of a valid message, and every single-byte corruption of its length
        // fields, either decodes or is an error.
        for cut in 0..good.len() {
            if let Ok(msgs) = messages(&good[..cut]) {
                for m in msgs {
                    let _ = diag_entry(m.payload);
                }
            }
        }
        for at in 0..good.len() {
            for v in [0u8, 1, 3, 4, 0x7f, 0xff] {
                let mut bad = good.clone();
                bad[at] = v;
                if let Ok(msgs) = messages(&bad) {
                    for m in msgs {
                        let _ = diag_entry(m.payload);
                        let _ = control(&m);
                        let _ = hs_limitation_value(m.payload);
                        let _ = genl_family_id(m.payload);
                    }
                }
            }
        }
        assert!(messages(&[1, 0, 0, 0]).is_err());
        assert!(diag_entry(&[0; 10]).is_err());
    }

    #[test]
    fn errors_and_acks() {
        let mut m = Vec::new();
        header(&mut m, NLMSG_ERROR, 0, 1);
        m.extend_from_slice(&(-libc::EPERM).to_ne_bytes());
        m.extend_from_slice(&[0u8; 16]);
        let m = finish(m);
        let msgs = messages(&m).unwrap();
        assert_eq!(control(&msgs[0]).unwrap(), Control::Error(libc::EPERM));
        let mut a = Vec::new();
        header(&mut a, NLMSG_ERROR, 0, 1);
        a.extend_from_slice(&0i32.to_ne_bytes());
        a.extend_from_slice(&[0u8; 16]);
        let a = finish(a);
        assert_eq!(control(&messages(&a).unwrap()[0]).unwrap(), Control::Ack);
    }

    #[test]
    fn generic_netlink_requests_and_replies() {
        let r = genl_family_request(SMC_GENL_FAMILY_NAME, 3);
        let m = messages(&r).unwrap();
        assert_eq!(m[0].ty, GENL_ID_CTRL);
        assert_eq!(m[0].payload[0], CTRL_CMD_GETFAMILY);
        let a = attrs(&m[0].payload[GENL_HDRLEN..]).unwrap();
        assert_eq!(a, vec![(CTRL_ATTR_FAMILY_NAME, &b"SMC_GEN_NETLINK\0"[..])]);

        // The controller's answer: a header, then the family id (and more we ignore).
        let mut reply = vec![1u8, 2, 0, 0];
        put_attr(&mut reply, CTRL_ATTR_FAMILY_NAME, b"SMC_GEN_NETLINK\0");
        put_attr(&mut reply, CTRL_ATTR_FAMILY_ID, &0x1du16.to_ne_bytes());
        assert_eq!(genl_family_id(&reply).unwrap(), 0x1d);
        assert!(genl_family_id(&reply[..8]).is_err());

        let on = hs_limitation_set(0x1d, true, 4);
        let m = messages(&on).unwrap();
        assert_eq!((m[0].ty, m[0].flags, m[0].payload[0]), (0x1d, NLM_F_REQUEST | NLM_F_ACK, 17));
        let off = hs_limitation_set(0x1d, false, 4);
        assert_eq!(messages(&off).unwrap()[0].payload[0], 18);
        let get = hs_limitation_get(0x1d, 5);
        let m = messages(&get).unwrap();
        assert_eq!((m[0].flags, m[0].payload[0]), (NLM_F_REQUEST | NLM_F_DUMP, 16));

        let mut v = vec![16u8, 1, 0, 0];
        put_attr(&mut v, SMC_NLA_HS_LIMITATION_ENABLED, &[1]);
        assert!(hs_limitation_value(&v).unwrap());
        let mut v = vec![16u8, 1, 0, 0];
        put_attr(&mut v, SMC_NLA_HS_LIMITATION_ENABLED, &[0]);
        assert!(!hs_limitation_value(&v).unwrap());
        assert!(hs_limitation_value(&[16, 1, 0, 0]).is_err());
    }

    #[test]
    fn the_abi_report_lists_every_fact_once() {
        let r = abi_report();
        assert_eq!(r.lines().count(), 20);
        assert!(r.contains("AF_SMC 43\n"));
        assert!(r.contains("sizeof_smc_diag_msg 64\n"));
    }
}
