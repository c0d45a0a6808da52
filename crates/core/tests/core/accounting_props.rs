//! Properties of every golden profile's counter over arbitrary `u32 × u32` sizes: no panic, never 0
//! tokens, deterministic, and the token run adds up to the expansion length.

use mmrouter_core::accounting::{Counter, ImageTokens, RequestContext};
use proptest::prelude::*;
use serde_json::{Map, Value};

fn counters() -> Vec<(String, Counter)> {
    let path = crate::fixtures().join("image_tokens.json");
    let golden: Value = serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("json");
    let profiles = golden["profiles"].as_object().expect("profiles");
    profiles
        .iter()
        .map(|(name, p)| {
            let mut kwargs = Map::new();
            if name == "mistral_small_3_1" {
                kwargs.insert("tokenizer_mode".into(), Value::from("mistral"));
            }
            let c = Counter::from_json(&p["preprocessor_config"], &p["config"], None, &kwargs).expect("counter");
            (name.clone(), c)
        })
        .collect()
}

fn side() -> impl Strategy<Value = u32> {
    prop_oneof![any::<u32>(), 0u32..64, 0u32..20_000, Just(u32::MAX), (1u32..=32).prop_map(|k| k * 28)]
}

fn check(name: &str, t: &ImageTokens) -> Result<(), TestCaseError> {
    prop_assert!(t.feature_tokens > 0, "{name}: zero feature tokens {t:?}");
    if let Some(e) = t.expansion_tokens {
        prop_assert!(e >= t.feature_tokens, "{name}: expansion below features {t:?}");
    }
    if let (Some(run), Some(e)) = (t.run(), t.expansion_tokens) {
        let sum: u64 = run.iter().map(|p| u64::from(p.repeat)).sum();
        prop_assert_eq!(sum, u64::from(e), "{}: run does not add up: {:?}", name, t);
        prop_assert!(run.iter().all(|p| p.repeat > 0 && !p.text.is_empty()), "{name}: empty run part");
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn counts_are_total_positive_and_deterministic(w in side(), h in side()) {
        for (name, c) in counters().iter() {
            let first = c.count(w, h);
            prop_assert_eq!(&first, &c.count(w, h), "{} not deterministic at {}x{}", name, w, h);
            match first {
                Ok(t) => check(name, &t)?,
                Err(e) => prop_assert!(!e.label().is_empty()),
            }
            if w == 0 || h == 0 {
                prop_assert_eq!(c.count(w, h).map_err(|e| e.label()), Err("zero_size"));
            }
        }
    }

    #[test]
    fn request_wide_counts_are_positive(
        sizes in proptest::collection::vec((side(), side()), 0..5),
        max_model_len in prop_oneof![any::<u32>(), 0u32..70_000],
        text in prop_oneof![any::<u32>(), 0u32..5_000],
    ) {
        let ctx = RequestContext { max_model_len: Some(max_model_len), text_tokens: Some(text) };
        for (name, c) in counters().iter() {
            let all = c.count_all(&sizes, &ctx);
            prop_assert_eq!(&all, &c.count_all(&sizes, &ctx));
            if let Ok(list) = all {
                prop_assert_eq!(list.len(), sizes.len());
                for t in &list {
                    check(name, t)?;
                }
            }
        }
    }
}
