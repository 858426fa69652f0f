//! Ethernet II + IPv4/IPv6 + UDP frames for the AF_XDP backend: the
//! headers the kernel stack would have written and checked, since frames
//! through XDP rings bypass it.
//!
//! Pure: no I/O, no allocation, no clock. Building writes into the
//! caller's buffer (a UMEM frame), [`seal_in_place`] in front of a
//! payload already encoded there, so a datagram is never copied twice.
//! Parsing borrows from the frame and never panics: every byte it reads
//! is untrusted. It accepts only what the replication transport sends
//! (unfragmented UDP, no IPv6 extension headers); anything else is an
//! error naming why, for the driver to count and hand to the kernel.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// Bytes of an Ethernet II header (two MACs and the ethertype, no FCS).
pub const ETH_HEADER_BYTES: usize = 14;
/// Bytes of an IPv4 header without options (the only kind we write).
pub const IPV4_HEADER_BYTES: usize = 20;
/// Bytes of the fixed IPv6 header.
pub const IPV6_HEADER_BYTES: usize = 40;
/// Bytes of a UDP header.
pub const UDP_HEADER_BYTES: usize = 8;

/// An Ethernet MAC address, in wire order.
pub type Mac = [u8; 6];

/// An 802.1Q tag: its ethertype (0x8100) then the tag control field.
const VLAN_TAG_BYTES: usize = 4;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86DD;
const ETHERTYPE_VLAN: u16 = 0x8100;
const IP_PROTO_UDP: u8 = 17;
/// IPv6 next header of a fragment header: refused as [`FrameError::Fragment`].
const IPV6_NEXT_FRAGMENT: u8 = 44;
/// IPv4 "don't fragment": our datagrams fit the path MTU or are not sent.
const IPV4_FLAG_DF: u16 = 0x4000;
/// IPv4 "more fragments" flag and fragment offset: either set means a
/// fragment.
const IPV4_FRAGMENT_MASK: u16 = 0x3FFF;
/// What the kernel would use; routers in between decrement it.
const TTL: u8 = 64;
/// The largest value of the IPv4 total length and UDP length fields.
const LENGTH_FIELD_MAX: usize = u16::MAX as usize;

/// The link and transport addresses of one frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameAddrs {
    /// The sending interface's MAC.
    pub src_mac: Mac,
    /// The next hop's MAC (the peer's, or the gateway's).
    pub dst_mac: Mac,
    /// Source IP and UDP port; same family as `dst`. An IPv4 peer must be
    /// a V4 address: an IPv4-mapped V6 one (`::ffff:a.b.c.d`, as from a
    /// dual-stack socket) would go out as IPv6; `to_canonical` first.
    pub src: SocketAddr,
    /// Destination IP and UDP port; same family as `src`.
    pub dst: SocketAddr,
}

/// A UDP datagram parsed out of a frame; the payload borrows from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParsedUdp<'a> {
    /// The sender's MAC (unchecked: no checksum covers it).
    pub src_mac: Mac,
    /// The MAC the frame was sent to (unchecked).
    pub dst_mac: Mac,
    /// Source IP and port (IPv6 with flow info and scope id 0).
    pub src: SocketAddr,
    /// Destination IP and port (IPv6 with flow info and scope id 0).
    pub dst: SocketAddr,
    /// The UDP payload, as long as the UDP length field says.
    pub payload: &'a [u8],
}

/// Why a frame could not be built or was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// The frame ends before a header, or before the length its IP
    /// header announces (truncated).
    TooShort,
    /// The ethertype (after at most one VLAN tag) is neither IPv4 nor IPv6.
    NotIp,
    /// The IP version nibble does not match the ethertype.
    BadIpVersion,
    /// IPv4 header length below 20 bytes or beyond the total length.
    BadIpHeaderLength,
    /// Length fields disagree: an IP payload too short for a UDP header,
    /// or a UDP length below 8 or beyond the IP payload.
    BadLength,
    /// The IPv4 header checksum does not verify.
    BadIpChecksum,
    /// The UDP checksum does not verify.
    BadUdpChecksum,
    /// An IPv6 UDP datagram without checksum (zero), which RFC 8200 forbids.
    MissingUdpChecksum,
    /// An IPv4 fragment (MF flag or an offset) or an IPv6 fragment header.
    Fragment,
    /// IPv6 extension headers before UDP (the XDP program leaves those to
    /// the kernel).
    ExtensionHeader,
    /// An IP protocol other than UDP.
    NotUdp,
    /// Building: source and destination of different address families.
    FamilyMismatch,
    /// Building: the payload does not fit the UDP (or IPv4) length field.
    PayloadTooLarge {
        /// The payload offered.
        payload_bytes: usize,
        /// The largest payload the family allows.
        max_bytes: usize,
    },
    /// Building: the buffer cannot hold the frame.
    BufferTooSmall {
        /// The frame's length.
        needed_bytes: usize,
        /// The buffer's length.
        buf_bytes: usize,
    },
}

impl FrameError {
    /// A stable snake_case name for a metric counting this error.
    pub fn counter_name(&self) -> &'static str {
        match self {
            FrameError::TooShort => "too_short",
            FrameError::NotIp => "not_ip",
            FrameError::BadIpVersion => "bad_ip_version",
            FrameError::BadIpHeaderLength => "bad_ip_header_length",
            FrameError::BadLength => "bad_length",
            FrameError::BadIpChecksum => "bad_ip_checksum",
            FrameError::BadUdpChecksum => "bad_udp_checksum",
            FrameError::MissingUdpChecksum => "missing_udp_checksum",
            FrameError::Fragment => "fragment",
            FrameError::ExtensionHeader => "extension_header",
            FrameError::NotUdp => "not_udp",
            FrameError::FamilyMismatch => "family_mismatch",
            FrameError::PayloadTooLarge { .. } => "payload_too_large",
            FrameError::BufferTooSmall { .. } => "buffer_too_small",
        }
    }
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::TooShort => {
                write!(f, "frame truncated: it ends before its headers or IP length")
            }
            FrameError::NotIp => write!(f, "ethertype is neither IPv4 nor IPv6"),
            FrameError::BadIpVersion => write!(f, "IP version does not match the ethertype"),
            FrameError::BadIpHeaderLength => {
                write!(f, "IPv4 header length is below 20 bytes or beyond the packet")
            }
            FrameError::BadLength => write!(f, "IP and UDP length fields disagree"),
            FrameError::BadIpChecksum => write!(f, "IPv4 header checksum does not verify"),
            FrameError::BadUdpChecksum => write!(f, "UDP checksum does not verify"),
            FrameError::MissingUdpChecksum => {
                write!(f, "IPv6 UDP datagram without a checksum (RFC 8200 forbids it)")
            }
            FrameError::Fragment => write!(f, "IP fragment (the transport never fragments)"),
            FrameError::ExtensionHeader => write!(f, "IPv6 extension header before UDP"),
            FrameError::NotUdp => write!(f, "IP protocol is not UDP"),
            FrameError::FamilyMismatch => {
                write!(f, "source and destination are of different IP families")
            }
            FrameError::PayloadTooLarge {
                payload_bytes,
                max_bytes,
            } => write!(
                f,
                "UDP payload of {payload_bytes} bytes is over the {max_bytes} bytes the length fields allow"
            ),
            FrameError::BufferTooSmall {
                needed_bytes,
                buf_bytes,
            } => write!(
                f,
                "frame of {needed_bytes} bytes does not fit a {buf_bytes}-byte buffer"
            ),
        }
    }
}

impl std::error::Error for FrameError {}

/// Bytes of Ethernet, IP and UDP headers in front of the payload: where
/// [`seal_in_place`] expects the payload.
pub fn headers_bytes(ip: &IpAddr) -> usize {
    match ip {
        IpAddr::V4(_) => ETH_HEADER_BYTES + IPV4_HEADER_BYTES + UDP_HEADER_BYTES,
        IpAddr::V6(_) => ETH_HEADER_BYTES + IPV6_HEADER_BYTES + UDP_HEADER_BYTES,
    }
}

/// The largest UDP payload the length fields allow: 65507 bytes over
/// IPv4 (the total length counts the IP header), 65527 over IPv6.
pub fn payload_bytes_max(ip: &IpAddr) -> usize {
    match ip {
        IpAddr::V4(_) => LENGTH_FIELD_MAX - IPV4_HEADER_BYTES - UDP_HEADER_BYTES,
        IpAddr::V6(_) => LENGTH_FIELD_MAX - UDP_HEADER_BYTES,
    }
}

/// Writes the whole frame (headers then a copy of `payload`) into `buf`
/// and returns its length. Nothing is written on error.
pub fn write_frame(
    buf: &mut [u8],
    addrs: &FrameAddrs,
    payload: &[u8],
) -> Result<usize, FrameError> {
    let headers = check_fits(buf.len(), addrs, payload.len())?;
    buf[headers..headers + payload.len()].copy_from_slice(payload);
    seal_in_place(buf, addrs, payload.len())
}

/// Writes the headers in front of a payload of `payload_len` bytes that
/// the caller already wrote at `buf[headers_bytes(&addrs.src.ip())..]`,
/// computing the checksums over it, and returns the frame's length. This
/// lets the driver encode a datagram straight into a UMEM frame. Nothing
/// is written on error. The frame is not padded to Ethernet's 60-byte
/// minimum: NICs pad short frames on transmit.
pub fn seal_in_place(
    buf: &mut [u8],
    addrs: &FrameAddrs,
    payload_len: usize,
) -> Result<usize, FrameError> {
    seal_in_place_with(buf, addrs, payload_len, UdpChecksum::Verify)
}

/// [`seal_in_place`], leaving the UDP checksum out over IPv4 if `udp_checksum`
/// is `Skip` (0, "none", RFC 768): a pass over the payload saved where the
/// payload carries a stronger check of its own. IPv6 always has one.
pub fn seal_in_place_with(
    buf: &mut [u8],
    addrs: &FrameAddrs,
    payload_len: usize,
    udp_checksum: UdpChecksum,
) -> Result<usize, FrameError> {
    let headers = check_fits(buf.len(), addrs, payload_len)?;
    let frame_len = headers + payload_len;
    let frame = &mut buf[..frame_len];
    frame[0..6].copy_from_slice(&addrs.dst_mac);
    frame[6..12].copy_from_slice(&addrs.src_mac);
    let udp_len = UDP_HEADER_BYTES + payload_len;
    // Both fit u16: check_fits bounded the payload by the family's maximum.
    let (udp_start, pseudo_sum) = match (addrs.src.ip(), addrs.dst.ip()) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => {
            frame[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
            let ip = &mut frame[ETH_HEADER_BYTES..ETH_HEADER_BYTES + IPV4_HEADER_BYTES];
            write_ipv4_header(ip, src, dst, (IPV4_HEADER_BYTES + udp_len) as u16);
            (
                ETH_HEADER_BYTES + IPV4_HEADER_BYTES,
                pseudo_header_sum(&src.octets(), &dst.octets(), udp_len),
            )
        }
        (IpAddr::V6(src), IpAddr::V6(dst)) => {
            frame[12..14].copy_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
            let ip = &mut frame[ETH_HEADER_BYTES..ETH_HEADER_BYTES + IPV6_HEADER_BYTES];
            write_ipv6_header(ip, src, dst, udp_len as u16);
            (
                ETH_HEADER_BYTES + IPV6_HEADER_BYTES,
                pseudo_header_sum(&src.octets(), &dst.octets(), udp_len),
            )
        }
        _ => unreachable!("check_fits refuses mixed families"),
    };
    let udp = &mut frame[udp_start..];
    udp[0..2].copy_from_slice(&addrs.src.port().to_be_bytes());
    udp[2..4].copy_from_slice(&addrs.dst.port().to_be_bytes());
    udp[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
    udp[6..8].copy_from_slice(&[0, 0]);
    if udp_checksum == UdpChecksum::Skip && addrs.src.is_ipv4() {
        return Ok(frame_len);
    }
    let checksum = !fold(pseudo_sum + sum_words(udp));
    // 0 on the wire means "no checksum" (and is refused over IPv6); its
    // ones'-complement twin 0xFFFF says the same sum (RFC 768).
    let checksum = if checksum == 0 { 0xFFFF } else { checksum };
    udp[6..8].copy_from_slice(&checksum.to_be_bytes());
    Ok(frame_len)
}

/// The header bytes for `addrs` if a payload of `payload_len` bytes can be
/// framed into a buffer of `buf_len` bytes.
fn check_fits(buf_len: usize, addrs: &FrameAddrs, payload_len: usize) -> Result<usize, FrameError> {
    let ip = addrs.src.ip();
    if ip.is_ipv4() != addrs.dst.is_ipv4() {
        return Err(FrameError::FamilyMismatch);
    }
    let max_bytes = payload_bytes_max(&ip);
    if payload_len > max_bytes {
        return Err(FrameError::PayloadTooLarge {
            payload_bytes: payload_len,
            max_bytes,
        });
    }
    let headers = headers_bytes(&ip);
    let needed_bytes = headers + payload_len;
    if buf_len < needed_bytes {
        return Err(FrameError::BufferTooSmall {
            needed_bytes,
            buf_bytes: buf_len,
        });
    }
    Ok(headers)
}

fn write_ipv4_header(ip: &mut [u8], src: Ipv4Addr, dst: Ipv4Addr, total_len: u16) {
    ip[0] = 0x45; // version 4, 5 words: no options
    ip[1] = 0; // DSCP and ECN: best effort
    ip[2..4].copy_from_slice(&total_len.to_be_bytes());
    // Identification 0 with DF: the datagram is atomic, never fragmented,
    // so the ID means nothing (RFC 6864) and needs no counter.
    ip[4..6].copy_from_slice(&[0, 0]);
    ip[6..8].copy_from_slice(&IPV4_FLAG_DF.to_be_bytes());
    ip[8] = TTL;
    ip[9] = IP_PROTO_UDP;
    ip[10..12].copy_from_slice(&[0, 0]);
    ip[12..16].copy_from_slice(&src.octets());
    ip[16..20].copy_from_slice(&dst.octets());
    let checksum = !fold(sum_words(ip));
    ip[10..12].copy_from_slice(&checksum.to_be_bytes());
}

fn write_ipv6_header(ip: &mut [u8], src: Ipv6Addr, dst: Ipv6Addr, payload_len: u16) {
    // Version 6; traffic class and flow label 0 (the kernel would hash a
    // flow label, but ECMP over our few peers gains nothing from it).
    ip[0..4].copy_from_slice(&[0x60, 0, 0, 0]);
    ip[4..6].copy_from_slice(&payload_len.to_be_bytes());
    ip[6] = IP_PROTO_UDP;
    ip[7] = TTL;
    ip[8..24].copy_from_slice(&src.octets());
    ip[24..40].copy_from_slice(&dst.octets());
}

/// Whether [`parse_udp_with`] verifies the UDP checksum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UdpChecksum {
    /// Verify it (and refuse IPv6's zero).
    Verify,
    /// Do not look at it: for payloads that carry a stronger check of
    /// their own, and for frames a local sender left with only the
    /// pseudo-header's sum (the kernel's CHECKSUM_PARTIAL through a veth).
    Skip,
}

/// Parses an Ethernet II frame (at most one 802.1Q tag) carrying UDP over
/// IPv4 or IPv6, verifying every checksum. Trailing bytes after the IP
/// packet (Ethernet padding) are ignored. Never panics.
pub fn parse_udp(frame: &[u8]) -> Result<ParsedUdp<'_>, FrameError> {
    parse_udp_with(frame, UdpChecksum::Verify)
}

/// [`parse_udp`], with the UDP checksum verified or not; the IPv4 header
/// checksum and every length are always checked.
pub fn parse_udp_with(
    frame: &[u8],
    udp_checksum: UdpChecksum,
) -> Result<ParsedUdp<'_>, FrameError> {
    if frame.len() < ETH_HEADER_BYTES {
        return Err(FrameError::TooShort);
    }
    let dst_mac = mac_at(frame, 0);
    let src_mac = mac_at(frame, 6);
    let mut ethertype = be16(frame, 12);
    let mut l3 = ETH_HEADER_BYTES;
    if ethertype == ETHERTYPE_VLAN {
        if frame.len() < ETH_HEADER_BYTES + VLAN_TAG_BYTES {
            return Err(FrameError::TooShort);
        }
        ethertype = be16(frame, 16);
        l3 += VLAN_TAG_BYTES;
    }
    let packet = &frame[l3..];
    let (src, dst, payload) = match ethertype {
        ETHERTYPE_IPV4 => parse_ipv4(packet, udp_checksum)?,
        ETHERTYPE_IPV6 => parse_ipv6(packet, udp_checksum)?,
        _ => return Err(FrameError::NotIp),
    };
    Ok(ParsedUdp {
        src_mac,
        dst_mac,
        src,
        dst,
        payload,
    })
}

type Parsed<'a> = (SocketAddr, SocketAddr, &'a [u8]);

fn parse_ipv4(p: &[u8], udp_checksum: UdpChecksum) -> Result<Parsed<'_>, FrameError> {
    if p.len() < IPV4_HEADER_BYTES {
        return Err(FrameError::TooShort);
    }
    if p[0] >> 4 != 4 {
        return Err(FrameError::BadIpVersion);
    }
    let header_len = usize::from(p[0] & 0x0F) * 4;
    if header_len < IPV4_HEADER_BYTES {
        return Err(FrameError::BadIpHeaderLength);
    }
    let total_len = usize::from(be16(p, 2));
    if total_len > p.len() {
        return Err(FrameError::TooShort);
    }
    if header_len > total_len {
        return Err(FrameError::BadIpHeaderLength);
    }
    // A header that sums (with its checksum) to all ones is intact.
    if fold(sum_words(&p[..header_len])) != 0xFFFF {
        return Err(FrameError::BadIpChecksum);
    }
    if be16(p, 6) & IPV4_FRAGMENT_MASK != 0 {
        return Err(FrameError::Fragment);
    }
    if p[9] != IP_PROTO_UDP {
        return Err(FrameError::NotUdp);
    }
    let src = Ipv4Addr::from(addr_at::<4>(p, 12));
    let dst = Ipv4Addr::from(addr_at::<4>(p, 16));
    let udp = &p[header_len..total_len];
    let (src_port, dst_port, payload) = parse_udp_segment(
        udp,
        |len| pseudo_header_sum(&src.octets(), &dst.octets(), len),
        true,
        udp_checksum,
    )?;
    Ok((
        SocketAddr::V4(SocketAddrV4::new(src, src_port)),
        SocketAddr::V4(SocketAddrV4::new(dst, dst_port)),
        payload,
    ))
}

fn parse_ipv6(p: &[u8], udp_checksum: UdpChecksum) -> Result<Parsed<'_>, FrameError> {
    if p.len() < IPV6_HEADER_BYTES {
        return Err(FrameError::TooShort);
    }
    if p[0] >> 4 != 6 {
        return Err(FrameError::BadIpVersion);
    }
    let payload_len = usize::from(be16(p, 4));
    if IPV6_HEADER_BYTES + payload_len > p.len() {
        return Err(FrameError::TooShort);
    }
    match p[6] {
        IP_PROTO_UDP => {}
        IPV6_NEXT_FRAGMENT => return Err(FrameError::Fragment),
        // The extension headers of the IANA registry: hop-by-hop, routing,
        // ESP, AH, destination options, mobility, HIP, shim6, experiments.
        0 | 43 | 50 | 51 | 60 | 135 | 139 | 140 | 253 | 254 => {
            return Err(FrameError::ExtensionHeader)
        }
        _ => return Err(FrameError::NotUdp),
    }
    let src = Ipv6Addr::from(addr_at::<16>(p, 8));
    let dst = Ipv6Addr::from(addr_at::<16>(p, 24));
    let udp = &p[IPV6_HEADER_BYTES..IPV6_HEADER_BYTES + payload_len];
    let (src_port, dst_port, payload) = parse_udp_segment(
        udp,
        |len| pseudo_header_sum(&src.octets(), &dst.octets(), len),
        false,
        udp_checksum,
    )?;
    Ok((
        SocketAddr::V6(SocketAddrV6::new(src, src_port, 0, 0)),
        SocketAddr::V6(SocketAddrV6::new(dst, dst_port, 0, 0)),
        payload,
    ))
}

/// Checks a UDP header and checksum in `udp` (the IP payload) and returns
/// the ports and payload. `pseudo_sum` gives the pseudo-header's sum for
/// a UDP length; `zero_checksum_ok` is IPv4's "0 means none".
fn parse_udp_segment(
    udp: &[u8],
    pseudo_sum: impl FnOnce(usize) -> u64,
    zero_checksum_ok: bool,
    udp_checksum: UdpChecksum,
) -> Result<(u16, u16, &[u8]), FrameError> {
    if udp.len() < UDP_HEADER_BYTES {
        return Err(FrameError::BadLength);
    }
    let udp_len = usize::from(be16(udp, 4));
    // Shorter than the IP payload is allowed (the rest is ignored, as the
    // kernel does); longer is not.
    if udp_len < UDP_HEADER_BYTES || udp_len > udp.len() {
        return Err(FrameError::BadLength);
    }
    let segment = &udp[..udp_len];
    if udp_checksum == UdpChecksum::Skip {
    } else if be16(udp, 6) == 0 {
        if !zero_checksum_ok {
            return Err(FrameError::MissingUdpChecksum);
        }
    } else if fold(pseudo_sum(udp_len) + sum_words(segment)) != 0xFFFF {
        return Err(FrameError::BadUdpChecksum);
    }
    Ok((be16(udp, 0), be16(udp, 2), &segment[UDP_HEADER_BYTES..]))
}

/// The unfolded sum of the UDP pseudo-header (RFC 768 for IPv4, RFC 8200
/// section 8.1 for IPv6): both carry the addresses, the protocol and the
/// UDP length, only laid out differently, which a sum does not see.
fn pseudo_header_sum(src: &[u8], dst: &[u8], udp_len: usize) -> u64 {
    sum_words(src) + sum_words(dst) + u64::from(IP_PROTO_UDP) + udp_len as u64
}

/// The ones'-complement sum of `bytes` as big-endian 16-bit words (an odd
/// last byte padded with zero), not yet folded. Eight bytes at a time: a
/// 32-bit word is two 16-bit words whose carries fold back the same
/// (2^16 = 1 modulo 0xFFFF), and u64 holds the carries of any frame.
fn sum_words(bytes: &[u8]) -> u64 {
    let mut sum = 0u64;
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let w = u64::from_be_bytes(word);
        sum += (w >> 32) + (w & 0xFFFF_FFFF);
    }
    let rest = chunks.remainder();
    // Zero padding on the right keeps each byte in its place in its word,
    // which is also RFC 1071's rule for an odd last byte.
    let mut tail = [0u8; 8];
    tail[..rest.len()].copy_from_slice(rest);
    let w = u64::from_be_bytes(tail);
    sum + (w >> 32) + (w & 0xFFFF_FFFF)
}

/// Folds a sum's carries back in until it fits 16 bits. Never 0 for a
/// nonzero sum, so an intact header or datagram folds to exactly 0xFFFF.
fn fold(mut sum: u64) -> u16 {
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    sum as u16
}

// The callers check `at + 2 <= b.len()` (or the array's length) first.
fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn mac_at(b: &[u8], at: usize) -> Mac {
    addr_at::<6>(b, at)
}

fn addr_at<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[at..at + N]);
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAYLOAD_SIZES: &[usize] = &[0, 1, 2, 7, 15, 64, 333, 1452, 8951, 8952];

    fn addrs_v4() -> FrameAddrs {
        FrameAddrs {
            src_mac: [0x02, 0, 0, 0, 0, 0x01],
            dst_mac: [0x02, 0, 0, 0, 0, 0x02],
            src: "10.1.2.3:40001".parse().unwrap(),
            dst: "10.1.2.4:7000".parse().unwrap(),
        }
    }

    fn addrs_v6() -> FrameAddrs {
        FrameAddrs {
            src: "[fd00::1]:40001".parse().unwrap(),
            dst: "[fd00::2]:7000".parse().unwrap(),
            ..addrs_v4()
        }
    }

    /// Deterministic bytes that exercise carries (many 0xFF) and zeros.
    fn payload(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                match x % 4 {
                    0 => 0xFF,
                    1 => 0,
                    _ => x as u8,
                }
            })
            .collect()
    }

    fn build(addrs: &FrameAddrs, payload: &[u8]) -> Vec<u8> {
        let mut buf = vec![0u8; headers_bytes(&addrs.src.ip()) + payload.len()];
        let n = write_frame(&mut buf, addrs, payload).unwrap();
        assert_eq!(n, buf.len());
        buf
    }

    /// RFC 1071 as written there: 16-bit words, one at a time, into a u32.
    fn ref_checksum(data: &[u8]) -> u16 {
        let mut sum: u32 = 0;
        let mut i = 0;
        while i + 1 < data.len() {
            sum += u32::from(u16::from_be_bytes([data[i], data[i + 1]]));
            i += 2;
        }
        if i < data.len() {
            sum += u32::from(data[i]) << 8;
        }
        while sum >> 16 != 0 {
            sum = (sum & 0xFFFF) + (sum >> 16);
        }
        !(sum as u16)
    }

    /// The UDP checksum the reference computes for the frame's segment,
    /// from a pseudo-header laid out byte by byte as the RFCs draw it.
    fn ref_udp_checksum(frame: &[u8], l3: usize, v6: bool) -> u16 {
        let mut data = Vec::new();
        let udp_start = if v6 {
            data.extend_from_slice(&frame[l3 + 8..l3 + 40]);
            let udp_len = u16::from_be_bytes([frame[l3 + 44], frame[l3 + 45]]);
            data.extend_from_slice(&u32::from(udp_len).to_be_bytes());
            data.extend_from_slice(&[0, 0, 0, 17]);
            l3 + 40
        } else {
            data.extend_from_slice(&frame[l3 + 12..l3 + 20]);
            data.extend_from_slice(&[0, 17]);
            data.extend_from_slice(&frame[l3 + 24..l3 + 26]);
            l3 + 20
        };
        let udp_len = usize::from(u16::from_be_bytes([
            frame[udp_start + 4],
            frame[udp_start + 5],
        ]));
        let mut segment = frame[udp_start..udp_start + udp_len].to_vec();
        segment[6] = 0;
        segment[7] = 0;
        data.extend_from_slice(&segment);
        match ref_checksum(&data) {
            0 => 0xFFFF,
            c => c,
        }
    }

    /// Recomputes the IPv4 header checksum after a test edited the header.
    fn reseal_ipv4(frame: &mut [u8], l3: usize) {
        // Clamped so that tests of bad header lengths can reseal too.
        let header_len = (usize::from(frame[l3] & 0x0F) * 4).clamp(20, frame.len() - l3);
        frame[l3 + 10] = 0;
        frame[l3 + 11] = 0;
        let c = ref_checksum(&frame[l3..l3 + header_len]);
        frame[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn round_trip_v4_and_v6() {
        for addrs in [addrs_v4(), addrs_v6()] {
            for &len in PAYLOAD_SIZES {
                let p = payload(len, len as u64);
                let frame = build(&addrs, &p);
                let parsed = parse_udp(&frame).unwrap();
                assert_eq!(parsed.src_mac, addrs.src_mac);
                assert_eq!(parsed.dst_mac, addrs.dst_mac);
                assert_eq!(parsed.src, addrs.src);
                assert_eq!(parsed.dst, addrs.dst);
                assert_eq!(parsed.payload, &p[..], "len {len}");
            }
        }
    }

    #[test]
    fn an_ipv4_frame_sealed_without_a_udp_checksum_says_none_and_ipv6_keeps_it() {
        for addrs in [addrs_v4(), addrs_v6()] {
            let p = payload(300, 4);
            let head = headers_bytes(&addrs.src.ip());
            let mut buf = vec![0u8; head + p.len()];
            buf[head..].copy_from_slice(&p);
            let n = seal_in_place_with(&mut buf, &addrs, p.len(), UdpChecksum::Skip).unwrap();
            let sum = u16::from_be_bytes([buf[head - 2], buf[head - 1]]);
            if addrs.src.is_ipv4() {
                assert_eq!(sum, 0, "none over IPv4");
            } else {
                assert_eq!(buf[..n], build(&addrs, &p)[..], "IPv6 always has one");
            }
            // Either way it parses, verified.
            assert_eq!(parse_udp(&buf[..n]).unwrap().payload, &p[..]);
        }
    }

    #[test]
    fn a_skipped_udp_checksum_is_not_looked_at_and_the_rest_still_is() {
        for addrs in [addrs_v4(), addrs_v6()] {
            let p = payload(100, 9);
            let mut frame = build(&addrs, &p);
            let head = headers_bytes(&addrs.src.ip());
            // A partial (pseudo-header only) sum, as a veth hands it up.
            frame[head - 2] ^= 0x5a;
            assert_eq!(parse_udp(&frame), Err(FrameError::BadUdpChecksum));
            let parsed = parse_udp_with(&frame, UdpChecksum::Skip).unwrap();
            assert_eq!((parsed.src, parsed.dst), (addrs.src, addrs.dst));
            assert_eq!(parsed.payload, &p[..]);
            // Lengths are still checked.
            let cut = &frame[..frame.len() - 1];
            assert!(parse_udp_with(cut, UdpChecksum::Skip).is_err());
        }
    }

    #[test]
    fn largest_payloads_fit_and_one_more_byte_does_not() {
        for (addrs, max) in [(addrs_v4(), 65507), (addrs_v6(), 65527)] {
            assert_eq!(payload_bytes_max(&addrs.src.ip()), max);
            let p = payload(max, 3);
            let frame = build(&addrs, &p);
            assert_eq!(parse_udp(&frame).unwrap().payload, &p[..]);
            let mut buf = vec![0u8; frame.len() + 1];
            assert_eq!(
                write_frame(&mut buf, &addrs, &payload(max + 1, 3)),
                Err(FrameError::PayloadTooLarge {
                    payload_bytes: max + 1,
                    max_bytes: max
                })
            );
        }
    }

    #[test]
    fn seal_in_place_frames_the_payload_already_there() {
        for addrs in [addrs_v4(), addrs_v6()] {
            let p = payload(333, 9);
            let h = headers_bytes(&addrs.src.ip());
            // A UMEM frame is larger than the datagram, with stale bytes.
            let mut umem = vec![0xA5u8; 4096];
            umem[h..h + p.len()].copy_from_slice(&p);
            let n = seal_in_place(&mut umem, &addrs, p.len()).unwrap();
            assert_eq!(n, h + p.len());
            assert_eq!(&umem[..n], &build(&addrs, &p)[..]);
            assert!(umem[n..].iter().all(|&b| b == 0xA5), "wrote past the frame");
        }
    }

    #[test]
    fn build_errors_write_nothing() {
        let p = payload(100, 1);
        for addrs in [addrs_v4(), addrs_v6()] {
            let need = headers_bytes(&addrs.src.ip()) + p.len();
            let mut buf = vec![0u8; need - 1];
            assert_eq!(
                write_frame(&mut buf, &addrs, &p),
                Err(FrameError::BufferTooSmall {
                    needed_bytes: need,
                    buf_bytes: need - 1
                })
            );
            assert!(buf.iter().all(|&b| b == 0));
        }
        let mixed = FrameAddrs {
            dst: addrs_v6().dst,
            ..addrs_v4()
        };
        let mut buf = vec![0u8; 1000];
        assert_eq!(
            write_frame(&mut buf, &mixed, &p),
            Err(FrameError::FamilyMismatch)
        );
        assert_eq!(
            seal_in_place(&mut buf, &mixed, 10),
            Err(FrameError::FamilyMismatch)
        );
        assert!(buf.iter().all(|&b| b == 0));
    }

    #[test]
    fn header_fields_are_what_the_kernel_would_write() {
        let frame = build(&addrs_v4(), &payload(10, 1));
        assert_eq!(&frame[12..14], &[0x08, 0x00]);
        let ip = &frame[14..34];
        assert_eq!(ip[0], 0x45);
        assert_eq!(ip[1], 0);
        assert_eq!(u16::from_be_bytes([ip[2], ip[3]]), 20 + 8 + 10);
        assert_eq!(&ip[4..8], &[0, 0, 0x40, 0], "id 0, DF, offset 0");
        assert_eq!(ip[8], 64);
        assert_eq!(ip[9], 17);
        assert_eq!(&frame[38..40], &[0, 18], "UDP length");

        let frame = build(&addrs_v6(), &payload(10, 1));
        assert_eq!(&frame[12..14], &[0x86, 0xDD]);
        let ip = &frame[14..54];
        assert_eq!(&ip[0..4], &[0x60, 0, 0, 0]);
        assert_eq!(u16::from_be_bytes([ip[4], ip[5]]), 18);
        assert_eq!(ip[6], 17);
        assert_eq!(ip[7], 64);
        assert_eq!(&frame[58..60], &[0, 18], "UDP length");
    }

    #[test]
    fn sum_matches_rfc1071_word_by_word() {
        // RFC 1071 section 3's example: the sum is 0xDDF2.
        let example = [0x00, 0x01, 0xF2, 0x03, 0xF4, 0xF5, 0xF6, 0xF7];
        assert_eq!(fold(sum_words(&example)), 0xDDF2);
        assert_eq!(ref_checksum(&example), 0x220D);
        for len in 0..=80 {
            for seed in 0..8 {
                let data = payload(len, seed);
                assert_eq!(!fold(sum_words(&data)), ref_checksum(&data), "len {len}");
                // The same bytes at an odd offset of their buffer.
                let mut shifted = vec![0x5A];
                shifted.extend_from_slice(&data);
                assert_eq!(!fold(sum_words(&shifted[1..])), ref_checksum(&data));
            }
        }
        let ones = vec![0xFFu8; 65536];
        assert_eq!(!fold(sum_words(&ones)), ref_checksum(&ones));
        assert_eq!(fold(sum_words(&[])), 0);
    }

    #[test]
    fn checksums_match_the_reference() {
        for (addrs, v6) in [(addrs_v4(), false), (addrs_v6(), true)] {
            for len in (0..=70).chain([1452, 8951, 8952]) {
                for seed in 0..3 {
                    let frame = build(&addrs, &payload(len, seed));
                    let udp_at = if v6 { 54 } else { 34 };
                    let udp_sum = u16::from_be_bytes([frame[udp_at + 6], frame[udp_at + 7]]);
                    assert_eq!(udp_sum, ref_udp_checksum(&frame, 14, v6), "len {len}");
                    if !v6 {
                        let mut resealed = frame.clone();
                        reseal_ipv4(&mut resealed, 14);
                        assert_eq!(resealed, frame, "IPv4 header checksum, len {len}");
                    }
                }
            }
        }
    }

    #[test]
    fn known_answer_frames() {
        // Built independently with Python's struct module and an RFC 1071
        // sum (the script is in the commit message that added this test).
        let p = b"quire xdp frame";
        assert_eq!(
            build(&addrs_v4(), p),
            hex(concat!(
                "020000000002020000000001080045000",
                "02b00004000401122ba0a0102030a0102049c411b580017dab07175697265",
                "20786470206672616d65"
            ))
        );
        assert_eq!(
            build(&addrs_v6(), p),
            hex(concat!(
                "02000000000202000000000186dd6000000000171140fd0000000000000000",
                "00000000000001fd0000000000000000000000000000029c411b580017f8b4",
                "717569726520786470206672616d65"
            ))
        );
        // The IPv4 header of Wikipedia's checksum example: 192.168.0.1 to
        // 192.168.0.199, total length 0x73, DF, TTL 64, UDP → 0xB861.
        let wiki = FrameAddrs {
            src: "192.168.0.1:1".parse().unwrap(),
            dst: "192.168.0.199:2".parse().unwrap(),
            ..addrs_v4()
        };
        let frame = build(&wiki, &[0; 0x73 - 28]);
        assert_eq!(&frame[24..26], &[0xB8, 0x61]);
    }

    #[test]
    fn computed_zero_udp_checksum_is_sent_as_all_ones() {
        for (addrs, udp_at) in [(addrs_v4(), 34), (addrs_v6(), 54)] {
            // Choose the last payload word so that the sum is all ones.
            let mut p = vec![0x12, 0x34, 0, 0];
            let frame = build(&addrs, &p);
            let without = !u16::from_be_bytes([frame[udp_at + 6], frame[udp_at + 7]]);
            let fill = 0xFFFF - without;
            p[2..4].copy_from_slice(&fill.to_be_bytes());
            let frame = build(&addrs, &p);
            assert_eq!(&frame[udp_at + 6..udp_at + 8], &[0xFF, 0xFF]);
            assert_eq!(parse_udp(&frame).unwrap().payload, &p[..]);
        }
    }

    #[test]
    fn zero_udp_checksum_means_none_over_ipv4_only() {
        let p = payload(40, 5);
        let mut v4 = build(&addrs_v4(), &p);
        v4[40] = 0;
        v4[41] = 0;
        assert_eq!(parse_udp(&v4).unwrap().payload, &p[..]);
        // With no checksum, the payload is taken as is.
        v4[50] ^= 1;
        assert!(parse_udp(&v4).is_ok());

        let mut v6 = build(&addrs_v6(), &p);
        v6[60] = 0;
        v6[61] = 0;
        assert_eq!(parse_udp(&v6), Err(FrameError::MissingUdpChecksum));
    }

    /// Positions that no checksum covers and that parse ignores, besides
    /// the MACs: IPv6 traffic class, flow label and hop limit.
    fn uncovered_v6(i: usize) -> bool {
        i == 15 || (16..18).contains(&i) || i == 21
    }

    #[test]
    fn every_bit_flip_is_refused_or_only_changes_what_nothing_covers() {
        for (addrs, v6) in [(addrs_v4(), false), (addrs_v6(), true)] {
            for len in [0, 5, 16] {
                let p = payload(len, 11);
                let frame = build(&addrs, &p);
                for i in 0..frame.len() {
                    for bit in 0..8 {
                        let mut bad = frame.clone();
                        bad[i] ^= 1 << bit;
                        let got = parse_udp(&bad);
                        if i < 12 {
                            let got = got.unwrap();
                            assert_ne!((got.dst_mac, got.src_mac), (addrs.dst_mac, addrs.src_mac));
                            assert_eq!(
                                (got.src, got.dst, got.payload),
                                (addrs.src, addrs.dst, &p[..])
                            );
                        } else if v6 && (i == 14 && bit < 4 || uncovered_v6(i)) {
                            // Byte 14's low nibble is traffic class; its
                            // high nibble (the version) is checked.
                            let got = got.unwrap();
                            assert_eq!(
                                (got.src, got.dst, got.payload),
                                (addrs.src, addrs.dst, &p[..])
                            );
                        } else if !v6 && (i == 40 || i == 41) && bad[40..42] == [0, 0] {
                            // A flip that zeroes the IPv4 UDP checksum
                            // turns it off, which is the protocol's rule.
                            assert!(got.is_ok());
                        } else {
                            assert!(
                                got.is_err(),
                                "flip of bit {bit} of byte {i} accepted: {got:?}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn every_truncation_is_refused() {
        let p = payload(21, 2);
        let mut frames = vec![build(&addrs_v4(), &p), build(&addrs_v6(), &p)];
        frames.push(with_vlan(&frames[0]));
        frames.push(with_vlan(&frames[1]));
        for frame in frames {
            assert!(parse_udp(&frame).is_ok());
            for len in 0..frame.len() {
                assert!(parse_udp(&frame[..len]).is_err(), "truncated to {len}");
            }
        }
        assert_eq!(parse_udp(&[]), Err(FrameError::TooShort));
    }

    fn with_vlan(frame: &[u8]) -> Vec<u8> {
        let mut tagged = frame[..12].to_vec();
        tagged.extend_from_slice(&[0x81, 0x00, 0x00, 0x64]); // VLAN 100
        tagged.extend_from_slice(&frame[12..]);
        tagged
    }

    #[test]
    fn one_vlan_tag_is_accepted_and_two_are_not() {
        for addrs in [addrs_v4(), addrs_v6()] {
            let p = payload(99, 4);
            let tagged = with_vlan(&build(&addrs, &p));
            let got = parse_udp(&tagged).unwrap();
            assert_eq!(
                (got.src, got.dst, got.payload),
                (addrs.src, addrs.dst, &p[..])
            );
            assert_eq!(parse_udp(&with_vlan(&tagged)), Err(FrameError::NotIp));
        }
    }

    #[test]
    fn trailing_ethernet_padding_is_ignored() {
        let p = payload(4, 6);
        for fill in [0x00, 0xEE] {
            let mut frame = build(&addrs_v4(), &p);
            assert_eq!(frame.len(), 46);
            frame.resize(60, fill);
            assert_eq!(parse_udp(&frame).unwrap().payload, &p[..]);
            let mut frame = build(&addrs_v6(), &p);
            frame.resize(frame.len() + 7, fill);
            assert_eq!(parse_udp(&frame).unwrap().payload, &p[..]);
        }
    }

    #[test]
    fn udp_length_shorter_than_the_ip_payload_bounds_the_payload() {
        // The kernel trims to the UDP length; so do we.
        let addrs = addrs_v4();
        let p = payload(20, 8);
        let mut frame = build(&addrs, &p[..12]);
        // Grow the IP packet by 8 bytes that the UDP length leaves out.
        frame.extend_from_slice(&p[12..]);
        let total = u16::from_be_bytes([frame[16], frame[17]]) + 8;
        frame[16..18].copy_from_slice(&total.to_be_bytes());
        reseal_ipv4(&mut frame, 14);
        assert_eq!(parse_udp(&frame).unwrap().payload, &p[..12]);
        // A UDP length beyond the IP payload, or below its header, is not.
        for udp_len in [7u16, 8 + 21, 0] {
            let mut bad = frame.clone();
            bad[38..40].copy_from_slice(&udp_len.to_be_bytes());
            assert_eq!(parse_udp(&bad), Err(FrameError::BadLength), "{udp_len}");
        }
    }

    #[test]
    fn ipv4_options_are_skipped() {
        let addrs = addrs_v4();
        let p = payload(17, 7);
        let plain = build(&addrs, &p);
        let mut frame = plain[..34].to_vec();
        frame.extend_from_slice(&[1, 1, 1, 0]); // NOP NOP NOP EOL
        frame.extend_from_slice(&plain[34..]);
        frame[14] = 0x46;
        let total = u16::from_be_bytes([frame[16], frame[17]]) + 4;
        frame[16..18].copy_from_slice(&total.to_be_bytes());
        reseal_ipv4(&mut frame, 14);
        let got = parse_udp(&frame).unwrap();
        assert_eq!(
            (got.src, got.dst, got.payload),
            (addrs.src, addrs.dst, &p[..])
        );
    }

    #[test]
    fn bad_ipv4_header_lengths_are_refused() {
        let frame = build(&addrs_v4(), &payload(30, 1));
        for (vihl, want) in [
            (0x44, FrameError::BadIpHeaderLength),
            (0x40, FrameError::BadIpHeaderLength),
            (0x4F, FrameError::BadIpHeaderLength), // 60 > total length 58
            (0x55, FrameError::BadIpVersion),
            (0x65, FrameError::BadIpVersion),
        ] {
            let mut bad = frame.clone();
            bad[14] = vihl;
            reseal_ipv4(&mut bad, 14);
            assert_eq!(parse_udp(&bad), Err(want), "{vihl:#x}");
        }
        let mut bad = frame.clone();
        bad[24] ^= 0x10;
        assert_eq!(parse_udp(&bad), Err(FrameError::BadIpChecksum));
        let mut bad = frame;
        bad[60] ^= 0x10;
        assert_eq!(parse_udp(&bad), Err(FrameError::BadUdpChecksum));
    }

    #[test]
    fn fragments_are_refused() {
        let frame = build(&addrs_v4(), &payload(30, 1));
        for flags in [0x2000u16, 0x6000, 0x0001, 0x4010, 0x1FFF] {
            let mut bad = frame.clone();
            bad[20..22].copy_from_slice(&flags.to_be_bytes());
            reseal_ipv4(&mut bad, 14);
            assert_eq!(parse_udp(&bad), Err(FrameError::Fragment), "{flags:#x}");
        }
        // DF alone (what we send) and no flags at all are whole datagrams.
        let mut whole = frame;
        whole[20..22].copy_from_slice(&[0, 0]);
        reseal_ipv4(&mut whole, 14);
        assert!(parse_udp(&whole).is_ok());

        let mut v6 = build(&addrs_v6(), &payload(30, 1));
        v6[20] = 44;
        assert_eq!(parse_udp(&v6), Err(FrameError::Fragment));
    }

    #[test]
    fn extension_headers_and_other_protocols_are_refused() {
        let v6 = build(&addrs_v6(), &payload(30, 1));
        for next in [0u8, 43, 60] {
            let mut bad = v6.clone();
            bad[20] = next;
            assert_eq!(parse_udp(&bad), Err(FrameError::ExtensionHeader), "{next}");
        }
        let mut tcp = v6.clone();
        tcp[20] = 6;
        assert_eq!(parse_udp(&tcp), Err(FrameError::NotUdp));

        let mut tcp = build(&addrs_v4(), &payload(30, 1));
        tcp[23] = 6;
        reseal_ipv4(&mut tcp, 14);
        assert_eq!(parse_udp(&tcp), Err(FrameError::NotUdp));

        let mut arp = v6;
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(parse_udp(&arp), Err(FrameError::NotIp));
        // The ethertype says IPv6, the header IPv4.
        let mut swapped = build(&addrs_v4(), &payload(60, 1));
        swapped[12..14].copy_from_slice(&[0x86, 0xDD]);
        assert_eq!(parse_udp(&swapped), Err(FrameError::BadIpVersion));
    }

    #[test]
    fn error_names_are_distinct_snake_case_and_messages_say_why() {
        let all = [
            FrameError::TooShort,
            FrameError::NotIp,
            FrameError::BadIpVersion,
            FrameError::BadIpHeaderLength,
            FrameError::BadLength,
            FrameError::BadIpChecksum,
            FrameError::BadUdpChecksum,
            FrameError::MissingUdpChecksum,
            FrameError::Fragment,
            FrameError::ExtensionHeader,
            FrameError::NotUdp,
            FrameError::FamilyMismatch,
            FrameError::PayloadTooLarge {
                payload_bytes: 70000,
                max_bytes: 65507,
            },
            FrameError::BufferTooSmall {
                needed_bytes: 100,
                buf_bytes: 64,
            },
        ];
        let mut names: Vec<_> = all.iter().map(FrameError::counter_name).collect();
        let mut messages: Vec<_> = all.iter().map(ToString::to_string).collect();
        for n in &names {
            assert!(n.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{n}");
        }
        names.sort_unstable();
        names.dedup();
        messages.sort_unstable();
        messages.dedup();
        assert_eq!(names.len(), all.len());
        assert_eq!(messages.len(), all.len());
        assert!(all[12].to_string().contains("70000"));
        assert!(all[13].to_string().contains("64-byte"));
    }
}
