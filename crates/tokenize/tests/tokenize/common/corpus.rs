#![allow(dead_code)]
//! A deterministic (seeded) multilingual test corpus.
//!
//! Documents mix English prose, source code, CJK, Arabic / Hebrew / Devanagari / Thai / Cyrillic / Greek /
//! Vietnamese, emoji (ZWJ sequences, skin tones, flags, keycaps), decomposed and otherwise non-NFC text,
//! every kind of Unicode white space, numbers in many scripts, contractions in all cases, inline special
//! tokens (and fragments of them), long runs, random code points and byte junk.

/// SplitMix64: tiny, seedable, good enough for test data.
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5DEE_CE66_D1CE_4E5B)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        ((self.next_u64() >> 11) % n as u64) as usize
    }
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
    /// A code point in `lo..=hi` (skipping surrogates).
    pub fn char_in(&mut self, lo: u32, hi: u32) -> char {
        loop {
            let c = lo + self.below((hi - lo + 1) as usize) as u32;
            if let Some(ch) = char::from_u32(c) {
                return ch;
            }
        }
    }
}

const EN: &str = "the of and to a in is that it was for on are as with his they at be this from I have or by \
one had not but what all were when we there can an your which their said if do will each about how up out them \
then she many some so these would other into has more her two like him see time could no make than first been its \
who now people my made over did down only way find use may water long little very after words called just where most \
know get through back much before go good new write our used me man too any day same right look think also around \
another came come work three word must because does part even place well such here take why things help put years \
different away again off went old number great tell men say small every found still between name should home big give \
air line set own under read last never us left end along while might next sound below saw something thought both few \
those always looked show large often together asked house don't world going want school important until form food keep \
children feet land side without boy once animals life enough took sometimes four head above kind began almost live page \
got earth need far hand high year mother light parts country father let night following picture being study second eyes \
soon times story boys since white days ever paper hard near sentence better best across during today others sure means \
knew it's try told young miles sun ways thing whole hear example heard several change answer room sea against top turned \
learn point city play toward five using himself usually money tokenizer router model request latency throughput budget \
GPU inference server batch queue cache shard replica kernel prompt completion streaming";

const SYLLABLES: &[&str] = &[
    "ka", "to", "ri", "men", "sul", "pra", "ex", "ion", "ter", "qu", "ab", "zy", "ph", "oth", "ing", "ly", "ment",
    "str", "sch", "ght", "ou", "ea", "ck", "x", "v", "w", "nd", "ae", "oo", "tz", "ll", "rr", "mm", "tion", "ous",
    "ity",
];

const ZH: &str = "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后\
小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高\
意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再\
平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期\
叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交\
爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步\
完革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持音";

const JA_KANA: (u32, u32) = (0x3041, 0x30FA);
const HANGUL: (u32, u32) = (0xAC00, 0xD7A3);

const SAMPLES: &[&str] = &[
    "我们今天讨论一下路由器的延迟问题，以及如何提高吞吐量。",
    "「東京タワー」は、東京都港区芝公園にある総合電波塔である。日本電波塔とも呼ばれる。",
    "대한민국은 동아시아의 한반도 남부에 위치한 민주공화국이다. 서울은 수도이다.",
    "اللُّغَةُ العَرَبِيَّةُ هي أكثر اللغات السامية تحدثاً، وإحدى أكثر اللغات انتشاراً في العالم.",
    "עִבְרִית היא שפה שמית, ממשפחת השפות האפרו-אסייתיות. שלום עולם!",
    "हिन्दी विश्व की एक प्रमुख भाषा है एवं भारत की राजभाषा है। क़लम ज़रूर ड़",
    "ภาษาไทย เป็นภาษาที่มีระดับเสียงของคำแน่นอนหรือวรรณยุกต์เช่นเดียวกับภาษาจีน",
    "Русский язык — один из восточнославянских языков, национальный язык русского народа.",
    "Η ελληνική γλώσσα ανήκει στην ινδοευρωπαϊκή οικογένεια. Ἀθῆναι, ὦ ἄνδρες.",
    "Tiếng Việt là ngôn ngữ của người Việt và là ngôn ngữ chính thức tại Việt Nam. Xin chào thế giới!",
    "Größenwahn über Äpfel: Straße, Ærøskøbing, naïve café, señor, façade, ﬁnancial, Ǆemal, ǅ.",
    "Ünïcödé ñämës: Zoë, Björk, José, Søren, Łukasz, İstanbul, ıi, ǈ, ꝏ, ſtraſſe.",
    "👩‍💻 deploying 🚀 to prod 🎉🎉 👍🏽👍🏿 🇺🇸🇯🇵 #️⃣ 1️⃣ ❤️‍🔥 🏳️‍🌈 🏴󠁧󠁢󠁳󠁣󠁴󠁿 👨‍👩‍👧‍👦 🧑🏻‍🤝‍🧑🏿",
    "Numbers: ٠١٢٣٤٥٦٧٨٩ ۰۱۲ ०१२३ ๑๒๓ １２３ ²³¹ ½¼¾ ⅫⅣ ①②③ 𝟘𝟙𝟚 ¹²⁰",
    "Spaces:\u{a0}nbsp\u{2000}en\u{2003}em\u{3000}ideographic\u{202f}narrow\u{205f}math\u{1680}ogham\u{85}nel\u{2028}ls\u{2029}ps",
    "Not spaces: zero\u{200b}width, bom\u{feff}, mongolian\u{180e}vs, joiner\u{200d}, nonjoiner\u{200c}.",
];

const SPECIAL: &[&str] = &[
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
];

const SPECIAL_FRAGMENTS: &[&str] =
    &["<|im_sta", "<|im_end", "|>", "<|", "<<|im_end|>|>", "<think", "</", "<|image_pad|", "<tool_call><tool_call>"];

const CONTRACTIONS: &[&str] = &[
    "'s",
    "'S",
    "'\u{17f}",
    "'t",
    "'T",
    "'re",
    "'RE",
    "'Re",
    "'rE",
    "'ve",
    "'VE",
    "'vE",
    "'m",
    "'M",
    "'ll",
    "'LL",
    "'lL",
    "'Ll",
    "'d",
    "'D",
    "\u{2019}s",
    "'x",
    "'",
    "''",
    "'\u{17f}\u{17f}",
];

const WS: &[&str] = &[
    " ",
    " ",
    " ",
    "  ",
    "   ",
    "    ",
    "\t",
    "\t\t",
    "\n",
    "\n\n",
    "\r\n",
    "\r\n\r\n",
    "\r",
    "\x0b",
    "\x0c",
    "\u{a0}",
    "\u{1680}",
    "\u{2000}",
    "\u{2001}",
    "\u{2002}",
    "\u{2005}",
    "\u{2009}",
    "\u{200a}",
    "\u{2028}",
    "\u{2029}",
    "\u{202f}",
    "\u{205f}",
    "\u{3000}",
    "\u{85}",
    " \n ",
    " \t\n",
    "\n \n",
    "  \r\n  ",
    "\u{a0} ",
    " \u{3000}",
];

const COMBINING: (u32, u32) = (0x0300, 0x036F);
const NON_NFC: &[&str] = &[
    "e\u{301}",
    "a\u{308}",
    "o\u{302}\u{301}",
    "a\u{323}\u{302}",
    "a\u{302}\u{323}",
    "\u{212b}",
    "\u{212a}",
    "\u{2126}",
    "\u{f900}",
    "\u{f91d}",
    "\u{fa10}",
    "\u{2f800}",
    "\u{1100}\u{1161}",
    "\u{1100}\u{1161}\u{11a8}",
    "\u{ac00}\u{11a8}",
    "\u{344}",
    "\u{f73}",
    "\u{f75}",
    "\u{958}",
    "\u{9dc}",
    "\u{fb1d}",
    "\u{1e9b}\u{323}",
    "\u{c5}",
    "A\u{30a}",
    "\u{3b9}\u{308}\u{301}",
    "\u{928}\u{93c}",
    "\u{9c7}\u{9be}",
    "\u{b47}\u{b3e}",
    "\u{cc6}\u{cc2}\u{cd5}",
    "\u{1025}\u{102e}",
    "\u{11099}\u{110ba}",
    "\u{1d15e}",
    "\u{2adc}",
    "\u{fb2c}",
    "\u{0338}",
    "=\u{338}",
    "<\u{338}",
];

fn en_word(r: &mut Rng) -> String {
    if r.chance(0.85) {
        static WORDS: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
        r.pick(WORDS.get_or_init(|| EN.split_whitespace().collect())).to_string()
    } else {
        (0..r.range(1, 5)).map(|_| r.pick(SYLLABLES)).collect()
    }
}

fn number(r: &mut Rng) -> String {
    match r.below(7) {
        0 => r.range(0, 99).to_string(),
        1 => r.range(1900, 2030).to_string(),
        2 => format!("{}.{}", r.range(0, 9999), r.range(0, 99)),
        3 => format!("{},{:03},{:03}", r.range(1, 999), r.range(0, 999), r.range(0, 999)),
        4 => format!("0x{:x}", r.next_u64() >> r.range(8, 60)),
        5 => format!("+1-555-{:04}", r.range(0, 9999)),
        _ => (r.next_u64() >> r.range(0, 40)).to_string(),
    }
}

pub fn prose(r: &mut Rng, out: &mut String) {
    let sentences = r.range(1, 8);
    for _ in 0..sentences {
        let n = r.range(3, 25);
        for i in 0..n {
            if i > 0 {
                out.push_str(if r.chance(0.97) { " " } else { r.pick(WS) });
            }
            let mut w = en_word(r);
            if i == 0 || r.chance(0.05) {
                let mut cs = w.chars();
                if let Some(c) = cs.next() {
                    w = c.to_uppercase().chain(cs).collect();
                }
            }
            if r.chance(0.03) {
                w = w.to_uppercase();
            }
            match r.below(40) {
                0 => w = format!("\"{w}\""),
                1 => w = format!("({w})"),
                2 => w.push_str(r.pick(CONTRACTIONS)),
                3 => w = number(r),
                4 => w.push(','),
                5 => w = format!("{w}-{}", en_word(r)),
                6 => w = format!("*{w}*"),
                7 => w = format!("`{w}`"),
                8 => w = format!("https://example.com/{w}?q={}", r.range(0, 999)),
                9 => w = format!("{w}@mail.org"),
                10 => w.push_str(" —"),
                11 => w.push_str("..."),
                _ => {}
            }
            out.push_str(&w);
        }
        out.push_str(r.pick(&[".", ".", ".", "!", "?", ":", ";", "?!", "..."]));
        out.push_str(r.pick(&[" ", " ", " ", "  ", "\n", "\n\n", "\r\n"]));
    }
}

fn ident(r: &mut Rng) -> String {
    let a = en_word(r).to_lowercase().replace('\'', "");
    match r.below(4) {
        0 => a,
        1 => format!("{a}_{}", en_word(r).to_lowercase().replace('\'', "")),
        2 => {
            let b = en_word(r).to_lowercase().replace('\'', "");
            let mut cs = b.chars();
            let cap: String = cs.next().map(|c| c.to_uppercase().chain(cs).collect()).unwrap_or_default();
            format!("{a}{cap}")
        }
        _ => format!("{}{}", a.to_uppercase(), r.range(0, 9)),
    }
}

pub fn code(r: &mut Rng, out: &mut String) {
    let nl = if r.chance(0.15) { "\r\n" } else { "\n" };
    let indent = r.pick(&["    ", "  ", "\t"]);
    let lang = r.below(7);
    let lines = r.range(3, 30);
    let mut depth = 0usize;
    for _ in 0..lines {
        let ind = indent.repeat(depth);
        let (a, b, c) = (ident(r), ident(r), ident(r));
        let n = number(r);
        let line = match (lang, r.below(6)) {
            (0, 0) => format!("fn {a}(&self, {b}: &[u8]) -> Result<Vec<u32>, Error> {{"),
            (0, 1) => format!("let {a} = {b}.iter().map(|x| x * {n}).collect::<Vec<_>>();"),
            (0, 2) => format!("// {}", en_word(r)),
            (0, _) => format!("if {a} != {b} && {c} >= {n} {{ return Err(Error::{}); }}", ident(r)),
            (1, 0) => format!("def {a}({b}, {c}=None):"),
            (1, 1) => format!("{a} = [{b} ** 2 for {b} in range({n}) if {b} % 3 == 0]"),
            (1, 2) => format!("# {} {}'s {}", en_word(r), en_word(r), en_word(r)),
            (1, _) => format!("print(f\"{{{a}!r}}: {{{b}:>{}}}\")", r.range(1, 20)),
            (2, 0) => format!("const {a} = async ({b}) => {{ await {c}.fetch(`/api/${{{b}}}`); }};"),
            (2, 1) => format!("export default function {a}() {{ return <div className=\"{b}\">{{{c}}}</div>; }}"),
            (2, _) => format!("{a}.{b} = {a}.{b} || {{}}; /* {} */", en_word(r)),
            (3, 0) => format!("static int {a}(const char *{b}, size_t {c}) {{"),
            (3, 1) => format!("#define {} ({n}u << 3)", a.to_uppercase()),
            (3, _) => format!("{a}->{b}[{c}++] = (uint8_t)({n} & 0xff);"),
            (4, 0) => format!("func ({a} *{b}) {c}(ctx context.Context) error {{"),
            (4, _) => {
                format!("if err := {a}.{b}({c}); err != nil {{ return fmt.Errorf(\"{}: %w\", err) }}", en_word(r))
            }
            (5, _) => {
                format!("SELECT {a}, COUNT(*) FROM {b} WHERE {c} > {n} GROUP BY {a} ORDER BY 2 DESC; -- {}", en_word(r))
            }
            (_, 0) => format!("<{a} class=\"{b}\" data-id='{n}'>&nbsp;{c}&amp;</{a}>"),
            (_, _) => format!("{{\"{a}\": [{n}, \"{b}\", null, true], \"{c}\": {{}}}},"),
        };
        out.push_str(&ind);
        out.push_str(&line);
        if r.chance(0.05) {
            out.push_str("   ");
        }
        out.push_str(nl);
        if line.ends_with('{') || line.ends_with(':') {
            depth += 1;
        } else if depth > 0 && r.chance(0.3) {
            depth -= 1;
            out.push_str(&indent.repeat(depth));
            out.push_str(if lang == 1 { "pass" } else { "}" });
            out.push_str(nl);
        }
        if r.chance(0.1) {
            out.push_str(nl);
        }
    }
}

pub fn cjk(r: &mut Rng, out: &mut String) {
    static ZH_CHARS: std::sync::OnceLock<Vec<char>> = std::sync::OnceLock::new();
    let zh = ZH_CHARS.get_or_init(|| ZH.chars().collect());
    let n = r.range(5, 80);
    for i in 0..n {
        match r.below(12) {
            0 => out.push(r.char_in(0x4E00, 0x9FFF)),
            1 => out.push(r.char_in(JA_KANA.0, JA_KANA.1)),
            2 => {
                out.push(r.char_in(HANGUL.0, HANGUL.1));
                if r.chance(0.3) {
                    out.push(' ');
                }
            }
            3 if i % 7 == 6 => out
                .push_str(r.pick(&["，", "。", "、", "；", "：", "？", "！", "「", "」", "（", "）", "《", "》", "…"])),
            4 if r.chance(0.2) => out.push_str(&en_word(r)),
            5 if r.chance(0.2) => out.push_str(&number(r)),
            6 if r.chance(0.1) => out.push(r.char_in(0xFF01, 0xFF5E)),
            7 if r.chance(0.05) => out.push(r.char_in(0x20000, 0x2A6DF)),
            _ => out.push(r.pick(zh)),
        }
    }
    if r.chance(0.5) {
        out.push_str(r.pick(&["。", "！", "\n", "。\n\n", "？"]));
    }
}

pub fn other_script(r: &mut Rng, out: &mut String) {
    type Range = (u32, u32);
    let (base, marks, digits): (Range, Option<Range>, Range) = match r.below(8) {
        0 => ((0x0621, 0x064A), Some((0x064B, 0x0652)), (0x0660, 0x0669)), // Arabic
        1 => ((0x05D0, 0x05EA), Some((0x05B0, 0x05BC)), (0x30, 0x39)),     // Hebrew
        2 => ((0x0905, 0x0939), Some((0x093E, 0x094D)), (0x0966, 0x096F)), // Devanagari
        3 => ((0x0E01, 0x0E2E), Some((0x0E31, 0x0E3A)), (0x0E50, 0x0E59)), // Thai
        4 => ((0x0410, 0x044F), None, (0x30, 0x39)),                       // Cyrillic
        5 => ((0x0391, 0x03C9), Some((0x0300, 0x0301)), (0x30, 0x39)),     // Greek
        6 => ((0x0061, 0x007A), Some((0x0300, 0x0323)), (0x30, 0x39)),     // Latin + marks (Vietnamese-like)
        _ => ((0x0E81, 0x0EAE), Some((0x0EB1, 0x0EBC)), (0x0ED0, 0x0ED9)), // Lao
    };
    let words = r.range(2, 30);
    for _ in 0..words {
        for _ in 0..r.range(1, 9) {
            out.push(r.char_in(base.0, base.1));
            if let Some(m) = marks {
                if r.chance(0.3) {
                    out.push(r.char_in(m.0, m.1));
                }
                if r.chance(0.05) {
                    out.push(r.char_in(m.0, m.1));
                }
            }
        }
        if r.chance(0.1) {
            for _ in 0..r.range(1, 5) {
                out.push(r.char_in(digits.0, digits.1));
            }
        }
        out.push_str(if r.chance(0.9) { " " } else { r.pick(&[".", "،", "।", "\n", ", ", "? "]) });
    }
}

pub fn emoji(r: &mut Rng, out: &mut String) {
    for _ in 0..r.range(1, 12) {
        match r.below(8) {
            0 => out.push(r.char_in(0x1F300, 0x1F5FF)),
            1 => {
                out.push(r.char_in(0x1F466, 0x1F469));
                out.push(r.char_in(0x1F3FB, 0x1F3FF));
            }
            2 => {
                let parts = r.range(2, 4);
                for p in 0..parts {
                    if p > 0 {
                        out.push('\u{200D}');
                    }
                    out.push(r.char_in(0x1F466, 0x1F469));
                }
            }
            3 => {
                out.push(r.char_in(0x1F1E6, 0x1F1FF));
                out.push(r.char_in(0x1F1E6, 0x1F1FF));
            }
            4 => {
                out.push(r.char_in(0x30, 0x39));
                out.push_str("\u{FE0F}\u{20E3}");
            }
            5 => {
                out.push(r.char_in(0x2600, 0x27BF));
                out.push('\u{FE0F}');
            }
            6 => out.push(r.char_in(0x1F900, 0x1F9FF)),
            _ => out.push_str(r.pick(&[" ", " ", "!", "\n", "ok "])),
        }
    }
}

pub fn non_nfc(r: &mut Rng, out: &mut String) {
    for _ in 0..r.range(1, 20) {
        match r.below(4) {
            0 => out.push_str(r.pick(NON_NFC)),
            1 => {
                out.push(r.char_in(0x41, 0x7A));
                for _ in 0..r.range(1, 4) {
                    out.push(r.char_in(COMBINING.0, COMBINING.1));
                }
            }
            2 => {
                // Hangul jamo: L V (T)
                out.push(r.char_in(0x1100, 0x1112));
                out.push(r.char_in(0x1161, 0x1175));
                if r.chance(0.5) {
                    out.push(r.char_in(0x11A8, 0x11C2));
                }
            }
            _ => out.push_str(&en_word(r)),
        }
        if r.chance(0.5) {
            out.push(' ');
        }
    }
}

pub fn whitespace(r: &mut Rng, out: &mut String) {
    for _ in 0..r.range(1, 15) {
        out.push_str(r.pick(WS));
        if r.chance(0.5) {
            out.push_str(&en_word(r));
        } else if r.chance(0.3) {
            out.push_str(r.pick(&["!", "--", "{", "}", "1", "23", "'s", "\u{4e2d}", "\u{e9}"]));
        }
    }
}

pub fn junk(r: &mut Rng, out: &mut String) {
    match r.below(4) {
        0 => {
            let bytes: Vec<u8> = (0..r.range(1, 60)).map(|_| r.below(256) as u8).collect();
            out.push_str(&String::from_utf8_lossy(&bytes));
        }
        1 => {
            for _ in 0..r.range(1, 30) {
                out.push(r.char_in(0, 0x10FFFF));
            }
        }
        2 => {
            for _ in 0..r.range(1, 40) {
                out.push(r.char_in(0, 0x7F));
            }
        }
        _ => {
            for _ in 0..r.range(1, 30) {
                out.push(r.char_in(0x80, 0x2FFF));
            }
        }
    }
}

pub fn special(r: &mut Rng, out: &mut String) {
    if r.chance(0.8) {
        out.push_str(r.pick(SPECIAL));
    } else {
        out.push_str(r.pick(SPECIAL_FRAGMENTS));
    }
    if r.chance(0.3) {
        out.push_str(r.pick(&["\n", "user\n", "assistant\n", " ", "system"]));
    }
}

pub fn long_run(r: &mut Rng, out: &mut String) {
    let n = r.range(50, 1500);
    match r.below(7) {
        0 => (0..n).for_each(|_| out.push(r.char_in(0x4E00, 0x9FFF))),
        1 => out.push_str(&"a".repeat(n)),
        2 => out.push_str(&" ".repeat(n)),
        3 => (0..n).for_each(|_| out.push(r.char_in(0x30, 0x39))),
        4 => out.push_str(&"=-".repeat(n / 2)),
        5 => (0..n).for_each(|_| out.push(r.pick(&[' ', '\t', '\n', '\u{3000}', '\r']))),
        _ => (0..n / 3).for_each(|_| out.push_str(&en_word(r))),
    }
}

/// Kinds of segment a document is built from.
#[derive(Clone, Copy, Debug)]
pub enum Mix {
    /// Everything, with the adversarial parts weighted up (parity tests).
    Adversarial,
    /// Mostly realistic text (benchmark): prose, code, CJK and other scripts, a few emoji/special tokens.
    Realistic,
}

/// One document of roughly `target` bytes.
pub fn document(r: &mut Rng, target: usize, mix: Mix) -> String {
    let mut s = String::with_capacity(target + 256);
    // Each document leans towards one kind, like real traffic.
    let lean = match mix {
        Mix::Adversarial => r.below(6),
        // prose 40%, code 25%, CJK 20%, other scripts 15%
        Mix::Realistic => [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3][r.below(20)],
    };
    while s.len() < target {
        let k = match mix {
            Mix::Adversarial => {
                if r.chance(0.4) {
                    lean
                } else {
                    r.below(12)
                }
            }
            Mix::Realistic => {
                if r.chance(0.9) {
                    lean
                } else {
                    r.below(7)
                }
            }
        };
        match k {
            0 => prose(r, &mut s),
            1 => code(r, &mut s),
            2 => cjk(r, &mut s),
            3 => other_script(r, &mut s),
            4 => {
                let t = r.pick(SAMPLES);
                s.push_str(t);
                s.push(' ');
            }
            5 => emoji(r, &mut s),
            6 => special(r, &mut s),
            7 => non_nfc(r, &mut s),
            8 => whitespace(r, &mut s),
            9 => junk(r, &mut s),
            10 => long_run(r, &mut s),
            _ => {
                let c = r.pick(CONTRACTIONS);
                s.push_str(c);
                s.push_str(r.pick(WS));
            }
        }
    }
    s
}

/// Documents totalling about `total` bytes, each between `min` and `max` bytes (target size).
pub fn documents(seed: u64, total: usize, min: usize, max: usize, mix: Mix) -> Vec<String> {
    let mut r = Rng::new(seed);
    let mut docs = Vec::new();
    let mut sum = 0;
    while sum < total {
        let target = r.range(min, max);
        let d = document(&mut r, target, mix);
        sum += d.len();
        docs.push(d);
    }
    docs
}
