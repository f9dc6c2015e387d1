//! Build script of the gateway. Two things are fixed at build time:
//!
//! - **The git revision** (`PRONTO_GIT_REVISION`, read with `env!`): `PRONTO_GIT_REVISION`
//!   from the build environment when set (the container build passes it as a build argument,
//!   since its context has no `.git`), else `git rev-parse --short=12 HEAD` of this checkout,
//!   else `unknown`. Shown by `pronto --version` and exported as `pronto_build_info`.
//! - **The example secrets' digests** (`$OUT_DIR/example_secrets.rs`): SHA-256 of every
//!   admin token and API key written in the YAML files under `config/` (commented out or not:
//!   a reader uncommenting an example must not end up serving with it) and of the DER of every
//!   PEM private key there (`config/tls/example.key`). The config loader refuses them
//!   (`crate::config::secrets`), so a deployment can never run on a secret published in this
//!   repository. Only digests enter the binary.
//!
//! No dependencies: SHA-256 and base64 are written out below (public inputs, and the build
//! checks the digest against a known vector; the tests check that the loader, which hashes
//! with `ring`, refuses every example secret).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let root = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    revision(&root);
    example_secrets(&root);
}

// === the git revision ===

fn revision(root: &Path) {
    println!("cargo:rerun-if-env-changed=PRONTO_GIT_REVISION");
    let rev = std::env::var("PRONTO_GIT_REVISION")
        .ok()
        .map(|r| r.trim().to_string())
        .filter(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_graphic()))
        .or_else(|| git_revision(root))
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=PRONTO_GIT_REVISION={rev}");
}

fn git(root: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(root)
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (out.status.success() && !text.is_empty()).then(|| text.to_string())
}

fn git_revision(root: &Path) -> Option<String> {
    let rev = git(root, &["rev-parse", "--short=12", "HEAD"])?;
    // Rebuild when HEAD moves: its file (a checkout) and the branch it names (a commit).
    let mut watched = vec!["HEAD".to_string(), "packed-refs".to_string()];
    watched.extend(git(root, &["symbolic-ref", "-q", "HEAD"]));
    for name in watched {
        if let Some(path) = git(
            root,
            &["rev-parse", "--path-format=absolute", "--git-path", &name],
        ) {
            if Path::new(&path).exists() {
                println!("cargo:rerun-if-changed={path}");
            }
        }
    }
    Some(rev)
}

// === the example secrets ===

/// One example secret: what it is, where it is written, its SHA-256.
struct Secret {
    kind: &'static str,
    at: String,
    digest: [u8; 32],
}

fn example_secrets(root: &Path) {
    assert_eq!(
        hex(&sha256(b"abc")),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
        "build.rs SHA-256 self-check"
    );
    let config = root.join("config");
    println!("cargo:rerun-if-changed={}", config.display());
    let mut files = Vec::new();
    walk(&config, &mut files);
    files.sort();
    let mut secrets: Vec<Secret> = Vec::new();
    for path in &files {
        let rel = path
            .strip_prefix(root)
            .unwrap_or(path)
            .display()
            .to_string();
        let Ok(text) = std::fs::read_to_string(path) else {
            continue;
        };
        match path.extension().and_then(|e| e.to_str()) {
            Some("yaml" | "yml") => {
                for (i, line) in text.lines().enumerate() {
                    for (kind, digest) in line_secrets(line) {
                        secrets.push(Secret {
                            kind,
                            at: format!("{rel}:{}", i + 1),
                            digest,
                        });
                    }
                }
            }
            _ => {
                if let Some(der) = pem_private_key(&text) {
                    secrets.push(Secret {
                        kind: "TLS private key",
                        at: rel,
                        digest: sha256(&der),
                    });
                }
            }
        }
    }
    let mut seen = std::collections::HashSet::new();
    secrets.retain(|s| seen.insert(s.digest));
    let mut out = String::from(
        "/// `(what, where, SHA-256)` of every example secret under `config/` (build.rs).\n\
         pub(crate) const EXAMPLE_SECRETS: &[(&str, &str, [u8; 32])] = &[\n",
    );
    for s in &secrets {
        let bytes: Vec<String> = s.digest.iter().map(|b| format!("0x{b:02x}")).collect();
        writeln!(
            out,
            "    ({:?}, {:?}, [{}]),",
            s.kind,
            s.at,
            bytes.join(", ")
        )
        .unwrap();
    }
    out.push_str("];\n");
    let dest = PathBuf::from(std::env::var_os("OUT_DIR").expect("set by cargo"))
        .join("example_secrets.rs");
    std::fs::write(dest, out).expect("write example_secrets.rs");
}

/// Every file under `dir`, except the simulator's profiles (`config/sim/`: no secrets).
fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n == "sim") {
                continue;
            }
            walk(&path, out);
        } else {
            out.push(path);
        }
    }
}

/// The secrets a config line writes, commented out or not: `token: V`, `key: V`,
/// `sha256: HEX` and `api_keys: [V, ...]` (in block or flow style). Values that cannot be
/// secrets are skipped: paths (`key: tls/example.key`), maps (`token: {env: NAME}`),
/// placeholders, and anything shorter than the loader's 8-character minimum.
fn line_secrets(line: &str) -> Vec<(&'static str, [u8; 32])> {
    let mut out = Vec::new();
    let text = line.trim_start().trim_start_matches(['#', '~', ' ', '-']);
    for field in ["token", "key", "sha256", "api_keys"] {
        let pattern = format!("{field}:");
        let mut from = 0;
        while let Some(at) = text[from..].find(&pattern).map(|i| i + from) {
            from = at + pattern.len();
            let before = text[..at].chars().next_back();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                continue;
            }
            let rest = text[from..].trim_start();
            if field == "api_keys" {
                let Some(list) = rest.strip_prefix('[') else {
                    continue;
                };
                let list = list.split(']').next().unwrap_or("");
                for v in list.split(',') {
                    if let Some(v) = secret_value(v) {
                        out.push(("API key", sha256(v.as_bytes())));
                    }
                }
                continue;
            }
            let end = rest.find([',', '}', '#']).unwrap_or(rest.len());
            let Some(v) = secret_value(&rest[..end]) else {
                continue;
            };
            match field {
                "sha256" => {
                    if let Some(d) = unhex(&v) {
                        out.push(("API key", d));
                    }
                }
                "token" => out.push(("admin token", sha256(v.as_bytes()))),
                _ => out.push(("API key", sha256(v.as_bytes()))),
            }
        }
    }
    out
}

fn secret_value(raw: &str) -> Option<String> {
    let v = raw.trim().trim_matches(|c| c == '"' || c == '\'');
    let plausible = v.len() >= 8
        && !v.starts_with(['{', '[', '<', '`', '$'])
        && !v.contains('/')
        && !v.contains(char::is_whitespace);
    plausible.then(|| v.to_string())
}

fn unhex(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The DER of the first PEM private key block in `text` (`-----BEGIN ... PRIVATE KEY-----`).
fn pem_private_key(text: &str) -> Option<Vec<u8>> {
    let mut lines = text.lines().map(str::trim);
    lines.find(|l| l.starts_with("-----BEGIN ") && l.ends_with("PRIVATE KEY-----"))?;
    let body: String = lines
        .take_while(|l| !l.starts_with("-----END "))
        .collect::<Vec<_>>()
        .concat();
    base64_decode(&body)
}

fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let data = text.trim_end_matches('=').as_bytes();
    let mut out = Vec::with_capacity(data.len() * 3 / 4);
    for chunk in data.chunks(4) {
        let mut acc = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            acc |= value(c)? << (18 - 6 * i);
        }
        let bytes = acc.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    Some(out)
}

/// SHA-256 (FIPS 180-4).
fn sha256(data: &[u8]) -> [u8; 32] {
    const K: [u32; 64] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2,
    ];
    let mut h: [u32; 8] = [
        0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
        0x5be0cd19,
    ];
    let mut msg = data.to_vec();
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&((data.len() as u64) * 8).to_be_bytes());
    for block in msg.chunks(64) {
        let mut w = [0u32; 64];
        for (i, word) in block.chunks(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..64 {
            let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
            let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16]
                .wrapping_add(s0)
                .wrapping_add(w[i - 7])
                .wrapping_add(s1);
        }
        let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut hh] = h;
        for i in 0..64 {
            let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
            let ch = (e & f) ^ (!e & g);
            let t1 = hh
                .wrapping_add(s1)
                .wrapping_add(ch)
                .wrapping_add(K[i])
                .wrapping_add(w[i]);
            let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
            let maj = (a & b) ^ (a & c) ^ (b & c);
            let t2 = s0.wrapping_add(maj);
            hh = g;
            g = f;
            f = e;
            e = d.wrapping_add(t1);
            d = c;
            c = b;
            b = a;
            a = t1.wrapping_add(t2);
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e, f, g, hh]) {
            *x = x.wrapping_add(y);
        }
    }
    let mut out = [0u8; 32];
    for (i, x) in h.iter().enumerate() {
        out[4 * i..4 * i + 4].copy_from_slice(&x.to_be_bytes());
    }
    out
}
