//! What each head attends to: runs a small causal layer (T = 16 tokens, D = 32, H = 4) and
//! draws its attention weights as a grid of H heatmaps in a PNG written by this example alone,
//! then prints head 0 as Unicode shades.
//!
//! ```sh
//! cargo run --release --example heatmap                   # writes heatmap.png
//! cargo run --release --example heatmap -- docs/heatmap.png
//! ```
//!
//! The weights are built by hand (plus seeded noise) so that each head has a pattern seen in
//! trained models: head 0 looks at the previous token, head 1 at the first token, head 2 at a
//! soft window of recent tokens, head 3 by content. They are stored as a GPT-2 checkpoint in
//! memory and loaded back with `MhaParams::from_safetensors`, as real weights would be.
//!
//! In the picture, row `i` of a heatmap is query `i`, column `j` is key `j`; the colour is
//! `√p` (dark purple 0 to yellow 1) so that weak weights stay visible; grey cells are the
//! future keys the causal mask hides.

use mha::safetensors::{serialize, Layout, SafeTensors};
use mha::{AttendOptions, AttentionWeights, Masking, Mha, MhaParams, Output, Tensor};

#[path = "common/split_mix.rs"]
mod split_mix;
use split_mix::SplitMix;

const T: usize = 16;
const D: usize = 32;
const H: usize = 4;
const HD: usize = D / H;
/// Angular frequencies of the four positional (sin, cos) pairs in features 0..8.
const FREQS: [f32; 4] = [
    core::f32::consts::PI / 16.0,
    core::f32::consts::PI / 8.0,
    core::f32::consts::PI / 4.0,
    core::f32::consts::PI / 2.0,
];
/// Feature 8 is always 1; feature 9 marks the first token; 10.. carry content.
const ONE: usize = 8;
const FIRST: usize = 9;
const CONTENT: usize = 10;

/// The tokens: positional pairs, a constant, a first-token flag and random content.
fn tokens(rng: &mut SplitMix) -> Tensor<1, T, D> {
    let content = rng.vec(T * D, 0.7);
    Tensor::from_fn(|_, t, i| match i {
        0..8 => {
            let angle = FREQS[i / 2] * t as f32;
            if i % 2 == 0 {
                angle.sin()
            } else {
                angle.cos()
            }
        }
        ONE => 1.0,
        FIRST => f32::from(u8::from(t == 0)),
        _ => content[t * D + i],
    })
}

/// A GPT-2 checkpoint of one attention layer whose heads have recognisable patterns.
fn checkpoint(rng: &mut SplitMix) -> Vec<u8> {
    // c_attn.weight is (D, 3D) in x @ W form: columns 0..D give q, D..2D k, 2D..3D v.
    let mut c_attn = rng.vec(D * 3 * D, 0.05);
    let mut set = |row: usize, col: usize, value: f32| c_attn[row * 3 * D + col] = value;
    let (q, k) = (0, D);
    // Head 0, previous token: q rotates each positional pair back by one step, so
    // q_i · k_j = β Σ cos(ω (i - 1 - j)), largest at j = i - 1.
    let beta = 8.0;
    for (pair, &w) in FREQS.iter().enumerate() {
        let (s, c) = (2 * pair, 2 * pair + 1);
        set(s, q + s, beta * w.cos());
        set(c, q + s, -beta * w.sin());
        set(s, q + c, beta * w.sin());
        set(c, q + c, beta * w.cos());
        set(s, k + s, 1.0);
        set(c, k + c, 1.0);
    }
    // Head 1, first token: every query asks for the first-token flag.
    set(ONE, q + HD, 4.0);
    set(FIRST, k + HD, 4.0);
    // Head 2, recent tokens: the two slowest positional pairs, unrotated and soft.
    for f in 0..4 {
        set(f, q + 2 * HD + f, 2.5);
        set(f, k + 2 * HD + f, 2.5);
    }
    // Head 3, content: random query and key maps of the content features.
    for row in CONTENT..D {
        for col in 3 * HD..4 * HD {
            set(row, q + col, rng.uniform() * 0.8);
            set(row, k + col, rng.uniform() * 0.8);
        }
    }
    for row in 0..D {
        for col in 2 * D..3 * D {
            set(row, col, rng.uniform() * 0.3);
        }
    }
    let c_attn_bias = rng.vec(3 * D, 0.02);
    let c_proj = rng.vec(D * D, 0.2);
    let c_proj_bias = rng.vec(D, 0.02);
    serialize(
        &[
            ("h.0.attn.c_attn.weight", &[D, 3 * D], &c_attn),
            ("h.0.attn.c_attn.bias", &[3 * D], &c_attn_bias),
            ("h.0.attn.c_proj.weight", &[D, D], &c_proj),
            ("h.0.attn.c_proj.bias", &[D], &c_proj_bias),
        ],
        &[("format", "pt")],
    )
    .expect("the checkpoint serializes")
}

// ---------------------------------------------------------------------------------------------
// The picture

/// Linear interpolation between five colours sampled from the viridis colour map.
fn colour(v: f32) -> [u8; 3] {
    const STOPS: [[f32; 3]; 5] = [
        [68.0, 1.0, 84.0],
        [59.0, 82.0, 139.0],
        [33.0, 145.0, 140.0],
        [94.0, 201.0, 98.0],
        [253.0, 231.0, 37.0],
    ];
    let x = v.clamp(0.0, 1.0) * 4.0;
    let i = (x as usize).min(3);
    let f = x - i as f32;
    core::array::from_fn(|c| (STOPS[i][c] + (STOPS[i + 1][c] - STOPS[i][c]) * f).round() as u8)
}

/// Draws the heads of batch element 0 side by side, two per row, as RGB pixels.
fn render(weights: &AttentionWeights, cell: usize, gap: usize) -> (usize, usize, Vec<u8>) {
    let [_, heads, t, s] = weights.shape();
    let cols = heads.min(2);
    let rows = heads.div_ceil(cols);
    let (w, h) = (
        cols * s * cell + (cols + 1) * gap,
        rows * t * cell + (rows + 1) * gap,
    );
    let mut rgb = vec![255u8; w * h * 3];
    for head in 0..heads {
        let block = weights.head(0, head).expect("head in range");
        let (x0, y0) = (
            gap + (head % cols) * (s * cell + gap),
            gap + (head / cols) * (t * cell + gap),
        );
        for i in 0..t {
            for j in 0..s {
                let pixel = if j > i {
                    [225, 225, 225]
                } else {
                    colour(block[i * s + j].sqrt())
                };
                for y in y0 + i * cell..y0 + (i + 1) * cell {
                    for x in x0 + j * cell..x0 + (j + 1) * cell {
                        rgb[(y * w + x) * 3..][..3].copy_from_slice(&pixel);
                    }
                }
            }
        }
    }
    (w, h, rgb)
}

/// CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320), as PNG chunks use.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xEDB8_8320 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}

/// Adler-32, the checksum that ends a zlib stream.
fn adler32(bytes: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for &byte in bytes {
        a = (a + u32::from(byte)) % 65_521;
        b = (b + a) % 65_521;
    }
    (b << 16) | a
}

/// Appends one PNG chunk: length, type, data, CRC of type and data.
fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    let start = out.len();
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    let crc = crc32(&out[start..]);
    out.extend_from_slice(&crc.to_be_bytes());
}

/// A deflate bit stream: values go in least-significant bit first, Huffman codes most
/// significant bit first (RFC 1951, section 3.1.1).
#[derive(Default)]
struct Bits {
    out: Vec<u8>,
    acc: u32,
    n: u32,
}

impl Bits {
    fn put(&mut self, value: u32, count: u32) {
        self.acc |= value << self.n;
        self.n += count;
        while self.n >= 8 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.n -= 8;
        }
    }
    fn code(&mut self, code: u32, len: u32) {
        self.put(code.reverse_bits() >> (32 - len), len);
    }
    /// A literal/length symbol in the fixed Huffman code (RFC 1951, section 3.2.6).
    fn symbol(&mut self, s: u32) {
        match s {
            0..=143 => self.code(0x30 + s, 8),
            144..=255 => self.code(0x190 + s - 144, 9),
            256..=279 => self.code(s - 256, 7),
            _ => self.code(0xC0 + s - 280, 8),
        }
    }
    /// A copy of the previous byte `len` times (3 ≤ len ≤ 258): a length, then distance 1.
    fn repeat(&mut self, len: usize) {
        const BASE: [usize; 29] = [
            3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99,
            115, 131, 163, 195, 227, 258,
        ];
        let i = BASE.iter().rposition(|&b| b <= len).expect("len >= 3");
        let extra = if (8..28).contains(&i) {
            (i as u32 - 4) / 4
        } else {
            0
        };
        self.symbol(257 + i as u32);
        self.put((len - BASE[i]) as u32, extra);
        self.code(0, 5); // distance code 0: distance 1
    }
}

/// One fixed-Huffman deflate block whose only matches are runs of a repeated byte: enough
/// for filtered heatmaps, which are mostly runs of zeros.
fn deflate(data: &[u8]) -> Vec<u8> {
    let mut bits = Bits::default();
    bits.put(1, 1); // BFINAL
    bits.put(1, 2); // BTYPE = 01, fixed Huffman codes
    let mut i = 0;
    while i < data.len() {
        let byte = data[i];
        bits.symbol(u32::from(byte));
        i += 1;
        let mut run = data[i..].iter().take_while(|&&b| b == byte).count();
        while run >= 3 {
            let len = run.min(258);
            bits.repeat(len);
            i += len;
            run -= len;
        }
    }
    bits.symbol(256); // end of block
    if bits.n > 0 {
        bits.out.push(bits.acc as u8);
    }
    bits.out
}

/// An 8-bit RGB PNG. Each scanline is filtered with `Sub` (difference to the pixel on the
/// left) or `Up` (difference to the pixel above), whichever gives more zeros, and the zlib
/// stream is one [`deflate`] block.
fn png(width: usize, height: usize, rgb: &[u8]) -> Vec<u8> {
    assert_eq!(rgb.len(), width * height * 3);
    let stride = width * 3;
    let mut raw = Vec::with_capacity(height * (1 + stride));
    for (y, line) in rgb.chunks_exact(stride).enumerate() {
        let above = |x: usize| if y == 0 { 0 } else { rgb[(y - 1) * stride + x] };
        let sub: Vec<u8> = (0..stride)
            .map(|x| line[x].wrapping_sub(if x < 3 { 0 } else { line[x - 3] }))
            .collect();
        let up: Vec<u8> = (0..stride)
            .map(|x| line[x].wrapping_sub(above(x)))
            .collect();
        let zeros = |v: &[u8]| v.iter().filter(|&&b| b == 0).count();
        let (filter, filtered) = if zeros(&up) >= zeros(&sub) {
            (2, up)
        } else {
            (1, sub)
        };
        raw.push(filter);
        raw.extend_from_slice(&filtered);
    }
    let mut zlib = vec![0x78, 0x01]; // deflate, 32 KiB window, no preset dictionary
    zlib.extend_from_slice(&deflate(&raw));
    zlib.extend_from_slice(&adler32(&raw).to_be_bytes());

    let mut ihdr = Vec::with_capacity(13);
    ihdr.extend_from_slice(&(width as u32).to_be_bytes());
    ihdr.extend_from_slice(&(height as u32).to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]); // 8 bits, RGB, deflate, adaptive filters, no interlace
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    chunk(&mut out, b"IHDR", &ihdr);
    chunk(&mut out, b"IDAT", &zlib);
    chunk(&mut out, b"IEND", &[]);
    out
}

/// Head `h` as rows of Unicode shades (two characters per key; hidden keys left blank).
fn shades(weights: &AttentionWeights, h: usize) -> String {
    const SHADES: [char; 5] = [' ', '░', '▒', '▓', '█'];
    let [_, _, t, s] = weights.shape();
    let block = weights.head(0, h).expect("head in range");
    let mut out = String::new();
    for i in 0..t {
        out.push_str(&format!("{i:>3} │"));
        for j in 0..s {
            let shade = if j > i {
                ' '
            } else {
                SHADES[(block[i * s + j].sqrt() * 4.0).round() as usize]
            };
            out.push(shade);
            out.push(shade);
        }
        out.push_str("│\n");
    }
    out
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    assert_eq!(adler32(b"Wikipedia"), 0x11E6_0398);
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "heatmap.png".into());

    println!("kernels: {}", mha::Isa::detect().name());
    let mut rng = SplitMix(2024);
    let x = tokens(&mut rng);
    let bytes = checkpoint(&mut rng);
    let st = SafeTensors::parse(&bytes)?;
    let (params, biases) = MhaParams::<D>::from_safetensors(&st, "h.0.attn", Layout::Gpt2, H)?;
    let mut layer = Mha::builder(&params, H)
        .masking(Masking::Causal)
        .biases(biases)
        .build()?;

    let mut weights = AttentionWeights::new();
    let mut out = Tensor::<1, T, D>::zeros();
    let output = Output::from(&mut out).with_weights(&mut weights);
    layer.forward_into(&x, AttendOptions::default(), output)?;

    let (w, h, rgb) = render(&weights, 14, 10);
    std::fs::write(&path, png(w, h, &rgb))?;
    println!("wrote {path}: {w}×{h}, {H} heads of ({T} queries × {T} keys)");

    let names = ["previous token", "first token", "recent tokens", "content"];
    for (head, name) in names.iter().enumerate() {
        let block = weights.head(0, head).expect("head in range");
        let mean_distance: f32 = (0..T)
            .flat_map(|i| (0..=i).map(move |j| (i, j)))
            .map(|(i, j)| block[i * T + j] * (i - j) as f32)
            .sum::<f32>()
            / T as f32;
        println!("head {head} ({name}): mean distance to the attended key {mean_distance:.2}");
    }
    println!("\nhead 0, rows = queries, columns = keys, shade = √p (\" ░▒▓█\"):");
    print!("{}", shades(&weights, 0));
    Ok(())
}
