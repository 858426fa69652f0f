//! The XDP program that steers the groups' UDP ports to the AF_XDP socket,
//! and the few `bpf(2)` commands needed to load and attach it.
//!
//! Why our own loader and a hand-assembled program instead of libbpf/libxdp
//! or aya: the program is some forty instructions, fixed but for its
//! parameters (the local address and the port range), so a C toolchain,
//! clang-built objects and their loaders (each a build dependency on a
//! fresh machine) would buy nothing. Every instruction is checked by the
//! kernel's verifier at load time, whose log is returned on refusal, and
//! the program's classification is tested without any network through
//! `BPF_PROG_TEST_RUN` (see the tests).
//!
//! The program passes to the kernel (XDP_PASS) everything that is not an
//! unfragmented IPv4 (without options) or IPv6 (without extension headers)
//! UDP datagram to the local address and a port in the range; the rest
//! goes to the AF_XDP socket of the receive queue it arrived on, through
//! an XSKMAP (`bpf_redirect_map` with XDP_PASS as the fallback, so a queue
//! without a socket still reaches the kernel's UDP socket).
//!
//! The program is attached with a BPF link (`BPF_LINK_CREATE`): the link
//! lives as long as its descriptor, so a daemon that dies (even by
//! SIGKILL) leaves no program on the interface.

use std::ffi::CString;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

// bpf(2) commands, map and program types (linux/bpf.h).
const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_TEST_RUN: libc::c_long = 10;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_XDP: u32 = 37;
/// `ld_imm64` source register meaning "the immediate is a map fd".
const BPF_PSEUDO_MAP_FD: u8 = 1;
/// Helper `bpf_redirect_map(map, key, flags)`.
const HELPER_REDIRECT_MAP: i32 = 51;

/// XDP return codes.
pub const XDP_DROP: u32 = 1;
/// Hand the frame to the kernel's stack.
pub const XDP_PASS: u32 = 2;
/// Send the frame back out (used only by the test-run variant).
pub const XDP_TX: u32 = 3;
/// Redirected (to the AF_XDP socket).
pub const XDP_REDIRECT: u32 = 4;

/// `XDP_FLAGS_SKB_MODE`: generic XDP, after the driver built an skb.
pub const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
/// `XDP_FLAGS_DRV_MODE`: native XDP in the driver.
pub const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;

/// Bytes of verifier log kept for a refused program.
const VERIFIER_LOG_BYTES: usize = 64 * 1024;

fn sys_bpf(cmd: libc::c_long, attr: &mut [u64]) -> io::Result<RawFd> {
    // SAFETY: attr is a zeroed, 8-byte aligned buffer at least as large as
    // the command's attribute struct; the kernel reads only `size` bytes.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.as_mut_ptr(),
            std::mem::size_of_val(attr) as libc::c_uint,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as RawFd)
    }
}

/// Writes `v` at byte offset `off` of the attribute buffer.
fn put_u32(attr: &mut [u64], off: usize, v: u32) {
    let word = &mut attr[off / 8];
    let shift = (off % 8) * 8;
    *word = (*word & !(0xffff_ffffu64 << shift)) | (u64::from(v) << shift);
}

fn get_u32(attr: &[u64], off: usize) -> u32 {
    (attr[off / 8] >> ((off % 8) * 8)) as u32
}

fn put_u64(attr: &mut [u64], off: usize, v: u64) {
    debug_assert_eq!(off % 8, 0);
    attr[off / 8] = v;
}

fn owned(fd: RawFd) -> OwnedFd {
    // SAFETY: the kernel just returned this descriptor to us.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// An XSKMAP: receive queue index -> AF_XDP socket.
pub fn create_xskmap(entries: u32) -> io::Result<OwnedFd> {
    let mut attr = [0u64; 16];
    put_u32(&mut attr, 0, BPF_MAP_TYPE_XSKMAP);
    put_u32(&mut attr, 4, 4); // key: queue index
    put_u32(&mut attr, 8, 4); // value: socket fd
    put_u32(&mut attr, 12, entries.max(1));
    sys_bpf(BPF_MAP_CREATE, &mut attr)
        .map(owned)
        .map_err(|e| annotate(e, "creating the XSKMAP (BPF_MAP_CREATE)"))
}

/// Puts AF_XDP socket `xsk` at `queue` in the XSKMAP.
pub fn xskmap_insert(map: RawFd, queue: u32, xsk: RawFd) -> io::Result<()> {
    let key = queue;
    let value = xsk as u32;
    let mut attr = [0u64; 4];
    put_u32(&mut attr, 0, map as u32);
    put_u64(&mut attr, 8, &key as *const u32 as u64);
    put_u64(&mut attr, 16, &value as *const u32 as u64);
    sys_bpf(BPF_MAP_UPDATE_ELEM, &mut attr)
        .map(|_| ())
        .map_err(|e| annotate(e, "adding the socket to the XSKMAP"))
}

fn annotate(e: io::Error, what: &str) -> io::Error {
    let hint = match e.raw_os_error() {
        Some(libc::EPERM) => {
            " (needs CAP_BPF and CAP_NET_ADMIN, or root; or a seccomp filter, such as a \
             systemd SystemCallFilter without `bpf`, forbids the call)"
        }
        Some(libc::ENOSYS) => " (the kernel has no bpf(2): CONFIG_BPF_SYSCALL)",
        Some(libc::EINVAL) => " (the kernel does not know this map or program type)",
        _ => "",
    };
    io::Error::new(e.kind(), format!("{what}: {e}{hint}"))
}

/// What the program does with a matching datagram.
#[derive(Clone, Copy, Debug)]
pub enum OnMatch {
    /// `bpf_redirect_map` to this XSKMAP by receive queue, XDP_PASS if the
    /// queue has no socket.
    Redirect(RawFd),
    /// Return this code (for testing the classification with
    /// `BPF_PROG_TEST_RUN`, where a redirect cannot be observed).
    Return(u32),
}

/// Which datagrams go to the socket: UDP to `local` on one of the routed
/// ports, arriving on the receive queue routed for that port.
#[derive(Clone, Debug)]
pub struct Steering {
    /// The local address the datagrams are sent to.
    pub local: IpAddr,
    /// (UDP destination port, the receive queue whose socket takes it).
    pub routes: Vec<(u16, u32)>,
}

/// One eBPF instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
struct Insn {
    code: u8,
    regs: u8, // dst in the low nibble, src in the high one
    off: i16,
    imm: i32,
}

// Opcode parts (linux/bpf_common.h, linux/bpf.h).
const LD: u8 = 0x00;
const LDX: u8 = 0x01;
const ALU: u8 = 0x04;
const JMP: u8 = 0x05;
const JMP32: u8 = 0x06;
const ALU64: u8 = 0x07;
const W: u8 = 0x00;
const H: u8 = 0x08;
const B: u8 = 0x10;
const DW: u8 = 0x18;
const IMM: u8 = 0x00;
const MEM: u8 = 0x60;
const K: u8 = 0x00;
const X: u8 = 0x08;
const ADD: u8 = 0x00;
const MOV: u8 = 0xb0;
const END: u8 = 0xd0;
const TO_BE: u8 = 0x08;
const JA: u8 = 0x00;
const JGT: u8 = 0x20;
const JNE: u8 = 0x50;
const CALL: u8 = 0x80;
const EXIT: u8 = 0x90;

/// A tiny assembler: instructions plus forward jumps to named labels.
#[derive(Default)]
struct Asm {
    insns: Vec<Insn>,
    /// (instruction index, label) of jumps still to resolve.
    fixups: Vec<(usize, String)>,
    labels: Vec<(String, usize)>,
}

impl Asm {
    fn raw(&mut self, code: u8, dst: u8, src: u8, off: i16, imm: i32) {
        self.insns.push(Insn {
            code,
            regs: (src << 4) | (dst & 0x0f),
            off,
            imm,
        });
    }
    fn mov64_reg(&mut self, dst: u8, src: u8) {
        self.raw(ALU64 | MOV | X, dst, src, 0, 0);
    }
    fn mov64_imm(&mut self, dst: u8, imm: i32) {
        self.raw(ALU64 | MOV | K, dst, 0, 0, imm);
    }
    fn add64_imm(&mut self, dst: u8, imm: i32) {
        self.raw(ALU64 | ADD | K, dst, 0, 0, imm);
    }
    /// `dst = *(size *)(src + off)`.
    fn load(&mut self, size: u8, dst: u8, src: u8, off: i16) {
        self.raw(LDX | MEM | size, dst, src, off, 0);
    }
    /// Byte swap of the low 16 bits between network and host order (a
    /// no-op on a big-endian host).
    fn host_order16(&mut self, dst: u8) {
        self.raw(ALU | END | TO_BE, dst, 0, 0, 16);
    }
    fn jump_imm(&mut self, op: u8, dst: u8, imm: i32, label: &str) {
        self.fixups.push((self.insns.len(), label.to_string()));
        self.raw(JMP | op | K, dst, 0, 0, imm);
    }
    /// Like `jump_imm` on the low 32 bits only (no sign extension of the
    /// immediate, which a 64-bit compare with a loaded word would do).
    fn jump32_imm(&mut self, op: u8, dst: u8, imm: i32, label: &str) {
        self.fixups.push((self.insns.len(), label.to_string()));
        self.raw(JMP32 | op | K, dst, 0, 0, imm);
    }
    fn jump_reg(&mut self, op: u8, dst: u8, src: u8, label: &str) {
        self.fixups.push((self.insns.len(), label.to_string()));
        self.raw(JMP | op | X, dst, src, 0, 0);
    }
    fn goto(&mut self, label: &str) {
        self.fixups.push((self.insns.len(), label.to_string()));
        self.raw(JMP | JA, 0, 0, 0, 0);
    }
    fn label(&mut self, name: &str) {
        self.labels.push((name.to_string(), self.insns.len()));
    }
    fn ld_map_fd(&mut self, dst: u8, fd: RawFd) {
        self.raw(LD | DW | IMM, dst, BPF_PSEUDO_MAP_FD, 0, fd);
        self.raw(0, 0, 0, 0, 0);
    }
    fn call(&mut self, helper: i32) {
        self.raw(JMP | CALL, 0, 0, 0, helper);
    }
    fn exit(&mut self) {
        self.raw(JMP | EXIT, 0, 0, 0, 0);
    }
    fn finish(mut self) -> Vec<Insn> {
        for (at, name) in &self.fixups {
            let at = *at;
            let target = self
                .labels
                .iter()
                .find(|l| &l.0 == name)
                .unwrap_or_else(|| panic!("label {name} is defined"))
                .1;
            self.insns[at].off = (target as i64 - at as i64 - 1) as i16;
        }
        self.insns
    }
}

/// `u32` as loaded from packet memory (host order) of these network-order
/// bytes, as the program's 32-bit compare immediate.
fn word_imm(b: [u8; 4]) -> i32 {
    u32::from_ne_bytes(b) as i32
}

/// The program's instructions. Registers: r6 the context, r7 the receive
/// queue, r2 data, r3 data_end, r4 bounds checks, r5 the field under test.
fn program(steer: &Steering, on_match: OnMatch) -> Vec<Insn> {
    const ETH: i16 = 14;
    let mut a = Asm::default();
    a.mov64_reg(6, 1);
    a.load(W, 2, 1, 0); // xdp_md.data
    a.load(W, 3, 1, 4); // xdp_md.data_end
                        // The verifier wants a bound check before any packet load.
    a.mov64_reg(4, 2);
    a.add64_imm(4, i32::from(ETH));
    a.jump_reg(JGT, 4, 3, "pass");
    a.load(H, 5, 2, 12); // ethertype
    a.host_order16(5);
    match steer.local {
        IpAddr::V4(ip) => {
            a.jump_imm(JNE, 5, 0x0800, "pass");
            a.mov64_reg(4, 2);
            a.add64_imm(4, i32::from(ETH) + 20 + 8);
            a.jump_reg(JGT, 4, 3, "pass");
            a.load(B, 5, 2, ETH); // version and header length
            a.jump_imm(JNE, 5, 0x45, "pass"); // options go to the kernel
            a.load(B, 5, 2, ETH + 9);
            a.jump_imm(JNE, 5, 17, "pass"); // UDP
            a.load(H, 5, 2, ETH + 6);
            a.host_order16(5);
            a.raw(ALU64 | 0x50 | K, 5, 0, 0, 0x3fff); // MF and the offset
            a.jump_imm(JNE, 5, 0, "pass"); // fragments go to the kernel
            a.load(W, 5, 2, ETH + 16); // destination address
            a.jump32_imm(JNE, 5, word_imm(ip.octets()), "pass");
            a.load(H, 5, 2, ETH + 20 + 2); // UDP destination port
        }
        IpAddr::V6(ip) => {
            a.jump_imm(JNE, 5, 0x86dd, "pass");
            a.mov64_reg(4, 2);
            a.add64_imm(4, i32::from(ETH) + 40 + 8);
            a.jump_reg(JGT, 4, 3, "pass");
            a.load(B, 5, 2, ETH + 6); // next header: extension headers pass
            a.jump_imm(JNE, 5, 17, "pass");
            let o = ip.octets();
            for i in 0..4 {
                a.load(W, 5, 2, ETH + 24 + 4 * i as i16);
                let b = [o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]];
                a.jump32_imm(JNE, 5, word_imm(b), "pass");
            }
            a.load(H, 5, 2, ETH + 40 + 2);
        }
    }
    a.host_order16(5);
    a.load(W, 7, 6, 16); // xdp_md.rx_queue_index
                         // Each routed port: redirect only from the queue of the loop that owns
                         // it; on another queue the kernel socket (that loop's) gets it.
    for (i, &(port, queue)) in steer.routes.iter().enumerate() {
        let next = format!("next{i}");
        a.jump_imm(JNE, 5, i32::from(port), &next);
        a.jump32_imm(JNE, 7, queue as i32, "pass");
        a.goto("match");
        a.label(&next);
    }
    a.goto("pass");
    a.label("match");
    match on_match {
        OnMatch::Redirect(map) => {
            a.mov64_reg(2, 7);
            a.ld_map_fd(1, map);
            a.mov64_imm(3, XDP_PASS as i32);
            a.call(HELPER_REDIRECT_MAP);
            a.exit();
        }
        OnMatch::Return(code) => {
            a.mov64_imm(0, code as i32);
            a.exit();
        }
    }
    a.label("pass");
    a.mov64_imm(0, XDP_PASS as i32);
    a.exit();
    a.finish()
}

/// A loaded XDP program.
pub struct Program {
    fd: OwnedFd,
    /// Instructions, for the log.
    pub insns: usize,
}

impl Program {
    /// Loads the steering program (checked by the kernel's verifier; its
    /// log is in the error if refused).
    pub fn load(steer: &Steering, on_match: OnMatch) -> io::Result<Program> {
        let insns = program(steer, on_match);
        // Without a log first: a log that fills its buffer makes the
        // kernel refuse even a valid program (ENOSPC). Only a refusal is
        // loaded again, with the log, to say why.
        match Program::load_insns(&insns, None) {
            Ok(fd) => Ok(Program {
                fd,
                insns: insns.len(),
            }),
            Err(_) => {
                let mut log = vec![0u8; VERIFIER_LOG_BYTES];
                match Program::load_insns(&insns, Some(&mut log)) {
                    Ok(fd) => Ok(Program {
                        fd,
                        insns: insns.len(),
                    }),
                    Err(e) => {
                        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
                        let text = String::from_utf8_lossy(&log[..end]);
                        let tail: Vec<&str> = text.lines().rev().take(6).collect();
                        let mut msg =
                            annotate(e, "loading the XDP program (BPF_PROG_LOAD)").to_string();
                        if !tail.is_empty() {
                            let tail: Vec<&str> = tail.into_iter().rev().collect();
                            msg.push_str(&format!("; verifier: {}", tail.join(" | ")));
                        }
                        Err(io::Error::other(msg))
                    }
                }
            }
        }
    }

    fn load_insns(insns: &[Insn], log: Option<&mut Vec<u8>>) -> io::Result<OwnedFd> {
        let license = CString::new("GPL").expect("no NUL");
        let mut name = [0u8; 16];
        name[..10].copy_from_slice(b"quire_xdp\0");
        let mut attr = [0u64; 16];
        put_u32(&mut attr, 0, BPF_PROG_TYPE_XDP);
        put_u32(&mut attr, 4, insns.len() as u32);
        put_u64(&mut attr, 8, insns.as_ptr() as u64);
        put_u64(&mut attr, 16, license.as_ptr() as u64);
        if let Some(log) = log {
            put_u32(&mut attr, 24, 1); // log_level
            put_u32(&mut attr, 28, log.len() as u32);
            put_u64(&mut attr, 32, log.as_mut_ptr() as u64);
        }
        // kern_version at 40, prog_flags at 44, prog_name at 48..64.
        for (i, chunk) in name.chunks(4).enumerate() {
            put_u32(
                &mut attr,
                48 + 4 * i,
                u32::from_ne_bytes(chunk.try_into().expect("4 bytes")),
            );
        }
        // prog_ifindex at 64, expected_attach_type at 68.
        put_u32(&mut attr, 68, BPF_XDP);
        sys_bpf(BPF_PROG_LOAD, &mut attr).map(owned)
    }

    /// Runs the program once on `frame` (`BPF_PROG_TEST_RUN`): its return
    /// code.
    pub fn test_run(&self, frame: &[u8]) -> io::Result<u32> {
        let mut out = vec![0u8; frame.len() + 256];
        let mut attr = [0u64; 10];
        put_u32(&mut attr, 0, self.fd.as_raw_fd() as u32);
        put_u32(&mut attr, 8, frame.len() as u32);
        put_u32(&mut attr, 12, out.len() as u32);
        put_u64(&mut attr, 16, frame.as_ptr() as u64);
        put_u64(&mut attr, 24, out.as_mut_ptr() as u64);
        put_u32(&mut attr, 32, 1); // repeat
        sys_bpf(BPF_PROG_TEST_RUN, &mut attr).map_err(|e| annotate(e, "BPF_PROG_TEST_RUN"))?;
        Ok(get_u32(&attr, 4))
    }

    /// Attaches the program to interface `ifindex` with a BPF link (gone
    /// when the returned descriptor closes). `flags`: native or generic
    /// XDP.
    pub fn attach(&self, ifindex: u32, flags: u32) -> io::Result<OwnedFd> {
        let mut attr = [0u64; 8];
        put_u32(&mut attr, 0, self.fd.as_raw_fd() as u32);
        put_u32(&mut attr, 4, ifindex);
        put_u32(&mut attr, 8, BPF_XDP);
        put_u32(&mut attr, 12, flags);
        sys_bpf(BPF_LINK_CREATE, &mut attr).map(owned).map_err(|e| {
            let hint = if e.raw_os_error() == Some(libc::EBUSY) {
                " (another XDP program is attached to the interface: `ip link show` names it)"
            } else {
                ""
            };
            io::Error::new(
                e.kind(),
                format!(
                    "attaching the XDP program to interface {ifindex} (BPF_LINK_CREATE): {e}{hint}"
                ),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }

    /// Ethernet + IPv4 + UDP to `dst:port`, with `extra` changes applied
    /// to the bytes before returning.
    fn v4(dst: [u8; 4], port: u16, extra: impl Fn(&mut Vec<u8>)) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 8 + 32];
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        f[14] = 0x45;
        f[14 + 9] = 17;
        f[14 + 12..14 + 16].copy_from_slice(&[10, 0, 0, 1]);
        f[14 + 16..14 + 20].copy_from_slice(&dst);
        f[34..36].copy_from_slice(&40000u16.to_be_bytes());
        f[36..38].copy_from_slice(&port.to_be_bytes());
        extra(&mut f);
        f
    }

    fn v6(dst: std::net::Ipv6Addr, port: u16, extra: impl Fn(&mut Vec<u8>)) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 40 + 8 + 32];
        f[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
        f[14] = 0x60;
        f[14 + 6] = 17;
        f[14 + 24..14 + 40].copy_from_slice(&dst.octets());
        f[56..58].copy_from_slice(&port.to_be_bytes());
        extra(&mut f);
        f
    }

    #[test]
    fn the_assembler_resolves_jumps_forward() {
        let mut a = Asm::default();
        a.goto("end");
        a.mov64_imm(0, 1);
        a.label("end");
        a.exit();
        let insns = a.finish();
        assert_eq!(insns[0].off, 1);
        assert_eq!(insns[2].code, JMP | EXIT);
    }

    #[test]
    fn the_program_steers_exactly_the_groups_datagrams() {
        if !root() {
            eprintln!("skipped: loading an XDP program needs root (CAP_BPF)");
            return;
        }
        let steer = Steering {
            local: "10.9.0.200".parse().unwrap(),
            routes: vec![(7000, 0), (7003, 0), (7002, 1)],
        };
        let p = Program::load(&steer, OnMatch::Return(XDP_TX)).expect("the verifier accepts it");
        let us = [10, 9, 0, 200];
        assert_eq!(p.test_run(&v4(us, 7000, |_| {})).unwrap(), XDP_TX);
        assert_eq!(p.test_run(&v4(us, 7003, |_| {})).unwrap(), XDP_TX);
        let passed: Vec<(&str, Vec<u8>)> = vec![
            ("port below", v4(us, 6999, |_| {})),
            ("a port between", v4(us, 7001, |_| {})),
            ("another queue's port", v4(us, 7002, |_| {})),
            ("port above", v4(us, 7004, |_| {})),
            ("another address", v4([10, 9, 0, 3], 7000, |_| {})),
            ("TCP", v4(us, 7000, |f| f[14 + 9] = 6)),
            ("IP options", v4(us, 7000, |f| f[14] = 0x46)),
            ("more fragments", v4(us, 7000, |f| f[14 + 6] = 0x20)),
            ("a later fragment", v4(us, 7000, |f| f[14 + 7] = 1)),
            ("ARP", v4(us, 7000, |f| f[12..14].copy_from_slice(&[8, 6]))),
            ("runt", v4(us, 7000, |f| f.truncate(14 + 20 + 4))),
            ("Ethernet only", v4(us, 7000, |f| f.truncate(14))),
            ("IPv6 frame", v6("fd00::2".parse().unwrap(), 7000, |_| {})),
        ];
        for (what, frame) in passed {
            assert_eq!(p.test_run(&frame).unwrap(), XDP_PASS, "{what}");
        }
        // Don't-fragment alone is not a fragment.
        assert_eq!(
            p.test_run(&v4(us, 7003, |f| f[14 + 6] = 0x40)).unwrap(),
            XDP_TX
        );
    }

    #[test]
    fn the_ipv6_program_steers_exactly_the_groups_datagrams() {
        if !root() {
            eprintln!("skipped: loading an XDP program needs root (CAP_BPF)");
            return;
        }
        let us: std::net::Ipv6Addr = "fd00::ff02".parse().unwrap();
        let steer = Steering {
            local: IpAddr::V6(us),
            routes: vec![(7000, 0)],
        };
        let p = Program::load(&steer, OnMatch::Return(XDP_TX)).expect("the verifier accepts it");
        assert_eq!(p.test_run(&v6(us, 7000, |_| {})).unwrap(), XDP_TX);
        let passed: Vec<(&str, Vec<u8>)> = vec![
            ("another port", v6(us, 7001, |_| {})),
            (
                "another address",
                v6("fd00::3".parse().unwrap(), 7000, |_| {}),
            ),
            ("an extension header", v6(us, 7000, |f| f[14 + 6] = 0)),
            ("runt", v6(us, 7000, |f| f.truncate(14 + 40 + 7))),
            ("IPv4 frame", v4([10, 9, 0, 2], 7000, |_| {})),
        ];
        for (what, frame) in passed {
            assert_eq!(p.test_run(&frame).unwrap(), XDP_PASS, "{what}");
        }
    }

    #[test]
    fn the_redirecting_program_loads_and_passes_without_a_socket() {
        if !root() {
            eprintln!("skipped: loading an XDP program needs root (CAP_BPF)");
            return;
        }
        let map = create_xskmap(4).unwrap();
        let steer = Steering {
            local: "10.9.0.2".parse().unwrap(),
            routes: vec![(7000, 0)],
        };
        let p = Program::load(&steer, OnMatch::Redirect(map.as_raw_fd())).unwrap();
        // No socket at queue 0: the fallback flag passes it to the kernel.
        let r = p.test_run(&v4([10, 9, 0, 2], 7000, |_| {})).unwrap();
        assert_eq!(r, XDP_PASS);
    }
}
