//! The checksums file catalogs use (FTS3, Rucio, XRootD): adler32, MD5 and CRC32C,
//! besides dmover's own content digests (docs/checksums.md).
//!
//! - [`ChecksumType`] and [`Checksum`]: the names and spellings catalogs use
//!   (`adler32` as 8 lower-case hex digits, zero-padded; `md5` as 32; `crc32c` as 8).
//! - [`Hasher`]: one type computed incrementally; [`adler32_combine`] and
//!   [`crc32c_combine`] join the values of two adjacent pieces, so [`Pieces`] gathers
//!   a file's pieces in any order. MD5 does not combine: it needs the bytes in order.
//! - [`PieceSums`]: a file's values from the pieces a destination writes, in any order
//!   (md5 through a bounded reorder window, [`InOrder`], else one re-read, reported).
//! - [`sum_file`]: a file's checksums, from the cache [`SUM_XATTR`] when its key
//!   ([`CacheKey`]: size, mtime and inode) still matches, else read once for every
//!   type asked and stored there.

use std::collections::BTreeMap;
use std::fmt;
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::str::FromStr;

use md5::Digest;
use rustix::fs::XattrFlags;
use rustix::io::Errno;

pub use dmover_proto::manifest::SUM_XATTR;

/// A checksum type of file catalogs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ChecksumType {
    /// zlib's Adler-32 (RFC 1950): the usual one of WLCG storage.
    Adler32,
    /// MD5 (RFC 1321).
    Md5,
    /// CRC-32C (Castagnoli, RFC 3720), as cloud object stores give it.
    Crc32c,
}

impl ChecksumType {
    /// Every type, in the order a report lists them.
    pub const ALL: [ChecksumType; 3] = [Self::Adler32, Self::Md5, Self::Crc32c];

    /// Its name as FTS3 and Rucio spell it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Adler32 => "adler32",
            Self::Md5 => "md5",
            Self::Crc32c => "crc32c",
        }
    }

    /// Whether the values of two adjacent pieces combine into the value of both (so
    /// pieces may be summed in any order): adler32 and crc32c, not md5.
    pub fn combines(self) -> bool {
        self != Self::Md5
    }
}

impl fmt::Display for ChecksumType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ChecksumType {
    type Err = String;

    /// The catalog names, whatever their case (`ADLER32` as some catalogs write it).
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("unknown checksum type {s:?} (adler32, md5 or crc32c)"))
    }
}

/// `kinds` without repeats, in the order of their first mention.
pub fn unique(kinds: &[ChecksumType]) -> Vec<ChecksumType> {
    let mut out: Vec<ChecksumType> = Vec::with_capacity(kinds.len());
    for &k in kinds {
        if !out.contains(&k) {
            out.push(k);
        }
    }
    out
}

/// One checksum value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checksum {
    /// Adler-32.
    Adler32(u32),
    /// MD5.
    Md5([u8; 16]),
    /// CRC-32C.
    Crc32c(u32),
}

impl Checksum {
    /// Its type.
    pub fn kind(&self) -> ChecksumType {
        match self {
            Self::Adler32(_) => ChecksumType::Adler32,
            Self::Md5(_) => ChecksumType::Md5,
            Self::Crc32c(_) => ChecksumType::Crc32c,
        }
    }

    /// Parses a value of type `kind` as [`Display`](fmt::Display) writes it (hex, any
    /// case; adler32 and crc32c also without their leading zeros).
    pub fn parse(kind: ChecksumType, hex: &str) -> Option<Checksum> {
        match kind {
            ChecksumType::Md5 => {
                if hex.len() != 32 || !hex.is_ascii() {
                    return None;
                }
                let mut v = [0u8; 16];
                for (i, b) in v.iter_mut().enumerate() {
                    *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
                }
                Some(Self::Md5(v))
            }
            _ if hex.is_empty() || hex.len() > 8 || hex.starts_with('+') => None,
            ChecksumType::Adler32 => u32::from_str_radix(hex, 16).ok().map(Self::Adler32),
            ChecksumType::Crc32c => u32::from_str_radix(hex, 16).ok().map(Self::Crc32c),
        }
    }
}

impl fmt::Display for Checksum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Adler32(v) | Self::Crc32c(v) => write!(f, "{v:08x}"),
            Self::Md5(v) => v.iter().try_for_each(|b| write!(f, "{b:02x}")),
        }
    }
}

/// One type computed incrementally over bytes in order.
#[derive(Clone)]
pub enum Hasher {
    /// Adler-32.
    Adler32(adler2::Adler32),
    /// MD5.
    Md5(md5::Md5),
    /// CRC-32C, the value so far.
    Crc32c(u32),
}

impl fmt::Debug for Hasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Hasher({})", self.kind())
    }
}

impl Hasher {
    /// A hasher of `kind` over no bytes yet.
    pub fn new(kind: ChecksumType) -> Self {
        match kind {
            ChecksumType::Adler32 => Self::Adler32(adler2::Adler32::new()),
            ChecksumType::Md5 => Self::Md5(md5::Md5::new()),
            ChecksumType::Crc32c => Self::Crc32c(0),
        }
    }

    /// Its type.
    pub fn kind(&self) -> ChecksumType {
        match self {
            Self::Adler32(_) => ChecksumType::Adler32,
            Self::Md5(_) => ChecksumType::Md5,
            Self::Crc32c(_) => ChecksumType::Crc32c,
        }
    }

    /// Adds the next bytes.
    pub fn update(&mut self, data: &[u8]) {
        match self {
            Self::Adler32(h) => h.write_slice(data),
            Self::Md5(h) => h.update(data),
            Self::Crc32c(v) => *v = crc32c::crc32c_append(*v, data),
        }
    }

    /// The value of the bytes added.
    pub fn finish(self) -> Checksum {
        match self {
            Self::Adler32(h) => Checksum::Adler32(h.checksum()),
            Self::Md5(h) => Checksum::Md5(h.finalize().into()),
            Self::Crc32c(v) => Checksum::Crc32c(v),
        }
    }
}

/// The checksum of `data` of type `kind`.
pub fn checksum(kind: ChecksumType, data: &[u8]) -> Checksum {
    let mut h = Hasher::new(kind);
    h.update(data);
    h.finish()
}

const BASE: u64 = 65521;

/// zlib's `adler32_combine`: the Adler-32 of `A || B` from `adler32(A)`, `adler32(B)`
/// and `B`'s length.
pub fn adler32_combine(adler1: u32, adler2: u32, len2: u64) -> u32 {
    let rem = len2 % BASE;
    let mut sum1 = u64::from(adler1 & 0xffff);
    let mut sum2 = (rem * sum1) % BASE;
    sum1 += u64::from(adler2 & 0xffff) + BASE - 1;
    sum2 += u64::from(adler1 >> 16) + u64::from(adler2 >> 16) + BASE - rem;
    if sum1 >= BASE {
        sum1 -= BASE;
    }
    if sum1 >= BASE {
        sum1 -= BASE;
    }
    if sum2 >= BASE << 1 {
        sum2 -= BASE << 1;
    }
    if sum2 >= BASE {
        sum2 -= BASE;
    }
    (sum1 | (sum2 << 16)) as u32
}

/// The CRC-32C of `A || B` from `crc32c(A)`, `crc32c(B)` and `B`'s length.
pub fn crc32c_combine(crc1: u32, crc2: u32, len2: u64) -> u32 {
    let len2 = usize::try_from(len2).expect("a 64-bit usize");
    crc32c::crc32c_combine(crc1, crc2, len2)
}

/// The value of two adjacent pieces, `a` then `b` (of `len_b` bytes), of a type that
/// combines; `None` for MD5 or values of different types.
pub fn combine(a: Checksum, b: Checksum, len_b: u64) -> Option<Checksum> {
    match (a, b) {
        (Checksum::Adler32(a), Checksum::Adler32(b)) => {
            Some(Checksum::Adler32(adler32_combine(a, b, len_b)))
        }
        (Checksum::Crc32c(a), Checksum::Crc32c(b)) => {
            Some(Checksum::Crc32c(crc32c_combine(a, b, len_b)))
        }
        _ => None,
    }
}

/// A file's pieces of one combining type, added in any order: adjacent ones are
/// joined at once, so it holds one value per run of contiguous bytes.
#[derive(Debug, Clone)]
pub struct Pieces {
    kind: ChecksumType,
    /// Offset of a run → its length and value.
    runs: BTreeMap<u64, (u64, Checksum)>,
}

impl Pieces {
    /// No pieces yet; `None` for a type that does not combine (MD5).
    pub fn new(kind: ChecksumType) -> Option<Self> {
        kind.combines().then(|| Self {
            kind,
            runs: BTreeMap::new(),
        })
    }

    /// Adds the piece of `len` bytes at `offset` whose value is `value` (of this type;
    /// the piece overlapping none added before).
    pub fn add(&mut self, offset: u64, len: u64, value: Checksum) {
        assert_eq!(value.kind(), self.kind, "a piece of another type");
        if len == 0 {
            return;
        }
        let end = offset + len;
        let (mut start, mut len, mut value) = (offset, len, value);
        if let Some((&o, &(l, v))) = self.runs.range(..offset).next_back()
            && o + l == offset
        {
            self.runs.remove(&o);
            value = combine(v, value, len).expect("one combining type");
            start = o;
            len += l;
        }
        if let Some((l, v)) = self.runs.remove(&end) {
            value = combine(value, v, l).expect("one combining type");
            len += l;
        }
        self.runs.insert(start, (len, value));
    }

    /// The value of the whole file of `size` bytes, once its pieces cover it.
    pub fn whole(&self, size: u64) -> Option<Checksum> {
        if size == 0 {
            return self
                .runs
                .is_empty()
                .then(|| Hasher::new(self.kind).finish());
        }
        match self.runs.get(&0) {
            Some(&(len, v)) if len == size && self.runs.len() == 1 => Some(v),
            _ => None,
        }
    }
}

/// MD5 of pieces that arrive out of order: each is fed once the bytes before it have
/// been, and those ahead wait, up to `limit` bytes held; past it the window gives up
/// (the caller reads the file once more, [`PieceSums::finish`]).
#[derive(Debug, Clone)]
pub struct InOrder {
    hasher: Hasher,
    next: u64,
    held: BTreeMap<u64, Vec<u8>>,
    held_bytes: usize,
    limit: usize,
    overflowed: bool,
}

impl InOrder {
    /// A window for `kind` holding at most `limit` bytes ahead of the next offset.
    pub fn new(kind: ChecksumType, limit: usize) -> Self {
        Self {
            hasher: Hasher::new(kind),
            next: 0,
            held: BTreeMap::new(),
            held_bytes: 0,
            limit,
            overflowed: false,
        }
    }

    /// Adds the piece `data` at `offset` (pieces never overlap).
    pub fn add(&mut self, offset: u64, data: &[u8]) {
        if self.overflowed || data.is_empty() {
            return;
        }
        if offset != self.next {
            if offset < self.next || self.held_bytes + data.len() > self.limit {
                self.give_up();
            } else {
                self.held_bytes += data.len();
                self.held.insert(offset, data.to_vec());
            }
            return;
        }
        self.hasher.update(data);
        self.next += data.len() as u64;
        while let Some(d) = self.held.remove(&self.next) {
            self.held_bytes -= d.len();
            self.hasher.update(&d);
            self.next += d.len() as u64;
        }
    }

    fn give_up(&mut self) {
        self.overflowed = true;
        self.held.clear();
        self.held_bytes = 0;
    }

    /// Whether the window gave up.
    pub fn overflowed(&self) -> bool {
        self.overflowed
    }

    /// The value, if every byte up to `size` came through the window.
    pub fn finish(self, size: u64) -> Option<Checksum> {
        (!self.overflowed && self.next == size).then(|| self.hasher.finish())
    }
}

/// The catalog checksums of one file from its pieces as a destination writes them, in
/// any order: adler32 and crc32c per piece, combined ([`Pieces`]); md5 through a
/// bounded reorder window ([`InOrder`]). What the pieces do not give (the window gave
/// up, holes never written) is read from the file once at the end.
#[derive(Debug, Clone)]
pub struct PieceSums {
    size: u64,
    kinds: Vec<ChecksumType>,
    combining: Vec<Pieces>,
    ordered: Vec<InOrder>,
}

/// What [`PieceSums::finish`] gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PieceReport {
    /// The values, in the order of the types asked.
    pub sums: Vec<Checksum>,
    /// Whether the file was read once more for some of them.
    pub reread: bool,
}

impl PieceSums {
    /// For a file of `size` bytes, the types `kinds`, md5's window holding at most
    /// `window` bytes.
    pub fn new(size: u64, kinds: &[ChecksumType], window: usize) -> Self {
        let kinds = unique(kinds);
        Self {
            size,
            combining: kinds.iter().filter_map(|&k| Pieces::new(k)).collect(),
            ordered: kinds
                .iter()
                .filter(|k| !k.combines())
                .map(|&k| InOrder::new(k, window))
                .collect(),
            kinds,
        }
    }

    /// Adds the piece `data` written at `offset`.
    pub fn add(&mut self, offset: u64, data: &[u8]) {
        for p in &mut self.combining {
            p.add(offset, data.len() as u64, checksum(p.kind, data));
        }
        for o in &mut self.ordered {
            o.add(offset, data);
        }
    }

    /// The values; those the pieces did not give are read from `file` (one read for
    /// all of them).
    pub fn finish(self, file: &File) -> io::Result<PieceReport> {
        let mut got: Vec<Checksum> = self
            .combining
            .iter()
            .filter_map(|p| p.whole(self.size))
            .collect();
        got.extend(self.ordered.into_iter().filter_map(|o| o.finish(self.size)));
        let missing: Vec<ChecksumType> = self
            .kinds
            .iter()
            .copied()
            .filter(|k| !got.iter().any(|c| c.kind() == *k))
            .collect();
        let reread = !missing.is_empty();
        if reread {
            got.extend(sum_file(file, &missing, CacheUse::OFF)?.sums);
        }
        let sums = self
            .kinds
            .iter()
            .filter_map(|k| got.iter().find(|c| c.kind() == *k).copied())
            .collect();
        Ok(PieceReport { sums, reread })
    }
}

/// What invalidates a cached checksum: the file's size, mtime (nanoseconds) and
/// inode. Not its ctime: storing the cache (an xattr) moves the ctime, with a
/// fine-grained timestamp on current kernels, so no stored ctime could match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheKey {
    /// Bytes.
    pub size: u64,
    /// Seconds since the epoch.
    pub mtime_s: i64,
    /// Nanoseconds.
    pub mtime_ns: i64,
    /// Inode number (a rename over the file gives another).
    pub ino: u64,
}

impl CacheKey {
    /// The key of a file's metadata.
    pub fn of(m: &std::fs::Metadata) -> Self {
        Self {
            size: m.size(),
            mtime_s: m.mtime(),
            mtime_ns: m.mtime_nsec(),
            ino: m.ino(),
        }
    }
}

/// The cache's contents: the key and the values computed under it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cached {
    /// What the values are valid for.
    pub key: CacheKey,
    /// The values, one per type at most.
    pub sums: Vec<Checksum>,
}

impl Cached {
    /// Its xattr value: `v1 size=N mtime=S.NNNNNNNNN ino=N adler32=… md5=… crc32c=…`.
    pub fn encode(&self) -> String {
        let k = &self.key;
        let mut s = format!(
            "v1 size={} mtime={}.{:09} ino={}",
            k.size, k.mtime_s, k.mtime_ns, k.ino
        );
        for c in &self.sums {
            s.push_str(&format!(" {}={c}", c.kind()));
        }
        s
    }

    /// Parses [`Cached::encode`]'s text; `None` for anything else (another version,
    /// a damaged value).
    pub fn decode(v: &[u8]) -> Option<Self> {
        let v = std::str::from_utf8(v).ok()?;
        let mut words = v.split(' ');
        if words.next()? != "v1" {
            return None;
        }
        let (mut size, mut mtime, mut ino) = (None, None, None);
        let mut sums: Vec<Checksum> = Vec::new();
        for w in words {
            let (k, val) = w.split_once('=')?;
            match k {
                "size" => size = Some(val.parse().ok()?),
                "ino" => ino = Some(val.parse().ok()?),
                "mtime" => {
                    let (s, ns) = val.split_once('.')?;
                    mtime = Some((s.parse().ok()?, ns.parse().ok()?));
                }
                _ => {
                    let c = Checksum::parse(k.parse().ok()?, val)?;
                    if sums.iter().any(|s| s.kind() == c.kind()) {
                        return None;
                    }
                    sums.push(c);
                }
            }
        }
        let (mtime_s, mtime_ns) = mtime?;
        Some(Self {
            key: CacheKey {
                size: size?,
                mtime_s,
                mtime_ns,
                ino: ino?,
            },
            sums,
        })
    }
}

/// Whether [`sum_file`] reads and stores the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheUse {
    /// Answers from a cache whose key matches.
    pub read: bool,
    /// Stores what it computed (where this process may set the file's xattrs).
    pub store: bool,
}

impl CacheUse {
    /// Both.
    pub const ON: CacheUse = CacheUse {
        read: true,
        store: true,
    };
    /// Neither: always read the file.
    pub const OFF: CacheUse = CacheUse {
        read: false,
        store: false,
    };
}

/// What [`sum_file`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SumReport {
    /// The values of the types asked, in their order.
    pub sums: Vec<Checksum>,
    /// The file's size.
    pub size: u64,
    /// Whether every value came from the cache (the file was not read).
    pub cached: bool,
    /// Whether the values computed were stored in the cache.
    pub stored: bool,
}

/// The cache of `file`, whatever its key (`None`: none, unreadable or damaged).
pub fn read_cache(file: &File) -> Option<Cached> {
    let mut buf = vec![0u8; 512];
    match rustix::fs::fgetxattr(file, SUM_XATTR, &mut buf[..]) {
        Ok(n) => Cached::decode(&buf[..n]),
        Err(_) => None,
    }
}

/// Stores `c` as `file`'s cache. `Ok(false)`: this process may not (no write
/// permission, a read-only or xattr-less file system).
pub fn write_cache(file: &File, c: &Cached) -> io::Result<bool> {
    match rustix::fs::fsetxattr(file, SUM_XATTR, c.encode().as_bytes(), XattrFlags::empty()) {
        Ok(()) => Ok(true),
        Err(e)
            if [
                Errno::ACCESS,
                Errno::PERM,
                Errno::ROFS,
                Errno::OPNOTSUPP,
                Errno::NOSPC,
                Errno::DQUOT,
            ]
            .contains(&e) =>
        {
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}

/// Size of one read of [`sum_file`].
const READ: usize = 1 << 20;

/// The checksums of `file` of the types in `kinds` (one each, in the order of their
/// first mention). With
/// `cache.read`, those its cache holds under the file's current key are not computed;
/// the file is read once (from its start, holes as zeros) for the others, and with
/// `cache.store` they join the cache, unless the file changed while it was read
/// (size, mtime or ctime).
pub fn sum_file(file: &File, kinds: &[ChecksumType], cache: CacheUse) -> io::Result<SumReport> {
    let before = file.metadata()?;
    if !before.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    let key = CacheKey::of(&before);
    let mut have: Vec<Checksum> = Vec::new();
    let old = if cache.read || cache.store {
        read_cache(file).filter(|c| c.key == key)
    } else {
        None
    };
    if cache.read
        && let Some(c) = &old
    {
        have.extend(c.sums.iter().filter(|s| kinds.contains(&s.kind())));
    }
    let kinds = unique(kinds);
    let mut hashers: Vec<Hasher> = kinds
        .iter()
        .filter(|k| !have.iter().any(|s| s.kind() == **k))
        .map(|&k| Hasher::new(k))
        .collect();
    let cached = hashers.is_empty();
    let mut stored = false;
    if !cached {
        let mut buf = vec![0u8; READ];
        let mut at = 0u64;
        loop {
            let n = match file.read_at(&mut buf, at) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if n == 0 {
                break;
            }
            for h in &mut hashers {
                h.update(&buf[..n]);
            }
            at += n as u64;
        }
        let after = file.metadata()?;
        let unchanged = CacheKey::of(&after) == key
            && at == key.size
            && (after.ctime(), after.ctime_nsec()) == (before.ctime(), before.ctime_nsec());
        let computed: Vec<Checksum> = hashers.into_iter().map(Hasher::finish).collect();
        if cache.store && unchanged {
            let mut sums: Vec<Checksum> = old.map(|c| c.sums).unwrap_or_default();
            sums.retain(|s| !computed.iter().any(|c| c.kind() == s.kind()));
            sums.extend(computed.iter().copied());
            sums.sort_by_key(Checksum::kind);
            stored = write_cache(file, &Cached { key, sums })?;
        }
        have.extend(computed);
    }
    let sums = kinds
        .iter()
        .filter_map(|k| have.iter().find(|s| s.kind() == *k).copied())
        .collect();
    Ok(SumReport {
        sums,
        size: key.size,
        cached,
        stored,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUICK: &[u8] = b"The quick brown fox jumps over the lazy dog";

    /// Known vectors: zlib's adler32, RFC 1321's MD5, RFC 3720's CRC-32C.
    #[test]
    fn known_vectors() {
        let hex = |k, d: &[u8]| checksum(k, d).to_string();
        use ChecksumType::*;
        assert_eq!(hex(Adler32, b""), "00000001");
        assert_eq!(hex(Adler32, b"Wikipedia"), "11e60398");
        assert_eq!(hex(Adler32, QUICK), "5bdc0fda");
        assert_eq!(hex(Md5, b""), "d41d8cd98f00b204e9800998ecf8427e");
        assert_eq!(hex(Md5, QUICK), "9e107d9d372bb6826bd81d3542a419d6");
        assert_eq!(hex(Crc32c, b""), "00000000");
        assert_eq!(hex(Crc32c, b"123456789"), "e3069283");
        assert_eq!(hex(Crc32c, &[0u8; 32]), "8a9136aa");
        // Leading zeros kept.
        assert_eq!(Checksum::Adler32(0x1234).to_string(), "00001234");
    }

    #[test]
    fn names_parse_and_print() {
        for t in ChecksumType::ALL {
            assert_eq!(t.name().parse::<ChecksumType>().unwrap(), t);
            assert_eq!(t.to_string(), t.name());
        }
        assert_eq!(
            "ADLER32".parse::<ChecksumType>().unwrap(),
            ChecksumType::Adler32
        );
        assert!("sha1".parse::<ChecksumType>().is_err());
        for d in [&b""[..], b"a", QUICK] {
            for t in ChecksumType::ALL {
                let c = checksum(t, d);
                assert_eq!(Checksum::parse(t, &c.to_string()), Some(c));
                assert_eq!(Checksum::parse(t, &c.to_string().to_uppercase()), Some(c));
            }
        }
        assert_eq!(
            Checksum::parse(ChecksumType::Adler32, "1"),
            Some(Checksum::Adler32(1))
        );
        for bad in ["", "123456789", "xyz", "+1"] {
            assert_eq!(Checksum::parse(ChecksumType::Crc32c, bad), None, "{bad}");
        }
        assert_eq!(Checksum::parse(ChecksumType::Md5, "00"), None);
        use ChecksumType::*;
        assert_eq!(
            unique(&[Md5, Adler32, Md5, Crc32c, Adler32]),
            vec![Md5, Adler32, Crc32c]
        );
    }

    /// Every split of a buffer into pieces, added in a scrambled order, combines to
    /// the value of the whole; MD5 does not combine.
    #[test]
    fn pieces_combine_in_any_order() {
        let data: Vec<u8> = (0..70_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        for t in [ChecksumType::Adler32, ChecksumType::Crc32c] {
            let whole = checksum(t, &data);
            for cuts in [
                vec![0, 70_000],
                vec![0, 1, 70_000],
                vec![0, 65_521, 65_522, 70_000],
                vec![0, 10, 10, 5000, 40_000, 69_999, 70_000],
            ] {
                let mut pieces: Vec<(u64, u64, Checksum)> = cuts
                    .windows(2)
                    .map(|w| {
                        let d = &data[w[0]..w[1]];
                        (w[0] as u64, d.len() as u64, checksum(t, d))
                    })
                    .collect();
                pieces.reverse();
                let half = pieces.len() / 2;
                pieces.rotate_left(half);
                let mut p = Pieces::new(t).unwrap();
                assert_eq!(p.whole(70_000), None);
                for (i, &(o, l, v)) in pieces.iter().enumerate() {
                    if i + 1 == pieces.len() {
                        assert_eq!(p.whole(70_000), None, "{t} {cuts:?}");
                    }
                    p.add(o, l, v);
                }
                assert_eq!(p.whole(70_000), Some(whole), "{t} {cuts:?}");
            }
            assert_eq!(Pieces::new(t).unwrap().whole(0), Some(checksum(t, b"")));
        }
        assert!(Pieces::new(ChecksumType::Md5).is_none());
        assert_eq!(
            combine(
                checksum(ChecksumType::Md5, b"a"),
                checksum(ChecksumType::Md5, b"b"),
                1
            ),
            None
        );
    }

    #[test]
    fn the_cache_text_round_trips() {
        let c = Cached {
            key: CacheKey {
                size: 5,
                mtime_s: 1_700_000_000,
                mtime_ns: 42,
                ino: 99,
            },
            sums: vec![
                checksum(ChecksumType::Adler32, b"hello"),
                checksum(ChecksumType::Md5, b"hello"),
            ],
        };
        let t = c.encode();
        assert_eq!(
            t,
            "v1 size=5 mtime=1700000000.000000042 ino=99 adler32=062c0215 md5=5d41402abc4b2a76b9719d911017c592"
        );
        assert_eq!(Cached::decode(t.as_bytes()), Some(c));
        for bad in [
            "",
            "v2 size=5",
            "v1 size=5 ino=1",
            "v1 size=x mtime=1.0 ino=1",
        ] {
            assert_eq!(Cached::decode(bad.as_bytes()), None, "{bad}");
        }
    }
}
