//! `--ec-shared-storage`: vLLM's ECExampleConnector as the simulator plays it. An encode sim writes one
//! small file per image it encoded (named by the image's mm_hash); a prefill, decode or aggregated sim
//! given the same directory "loads the encoder cache" of an image whose file exists instead of running
//! the vision encoder. The files hold no embeddings, only what a reader of the directory may want.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::prompt::SimImage;

/// Longest mm_hash used as a file name as it is; longer (or unsafe) names are hashed.
const MAX_PLAIN_NAME: usize = 128;

/// The file that stands for `mm_hash`'s encoder output in `dir`. A client's uuid may hold any
/// character, so a name that is not plainly safe is replaced by its BLAKE3 hex.
pub(crate) fn path(dir: &Path, mm_hash: &str) -> PathBuf {
    let plain = !mm_hash.is_empty()
        && mm_hash.len() <= MAX_PLAIN_NAME
        && !mm_hash.starts_with('.')
        && mm_hash.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    let name = if plain { mm_hash.to_owned() } else { format!("h-{}", blake3::hash(mm_hash.as_bytes()).to_hex()) };
    dir.join(format!("{name}.ec"))
}

/// For each image, whether the shared storage holds its encoder output.
pub(crate) fn present(dir: Option<&Path>, images: &[SimImage]) -> Vec<bool> {
    match dir {
        Some(dir) => images.iter().map(|i| path(dir, &i.identifier).is_file()).collect(),
        None => vec![false; images.len()],
    }
}

/// Writes each image's file unless it exists; returns how many were written. Each file appears
/// whole: written under a temporary name, then renamed, so a reader never sees half of one.
pub(crate) fn store(dir: &Path, images: &[SimImage]) -> std::io::Result<u64> {
    let mut written = 0;
    for image in images {
        let target = path(dir, &image.identifier);
        if target.is_file() {
            continue;
        }
        let content = serde_json::json!({
            "mm_hash": image.identifier,
            "num_encoder_tokens": image.feature_tokens,
            "width": image.width,
            "height": image.height,
        });
        let tmp = dir.join(format!(".{}.{:016x}.tmp", std::process::id(), rand::random::<u64>()));
        let write = || -> std::io::Result<()> {
            let mut file = std::fs::File::create(&tmp)?;
            file.write_all(content.to_string().as_bytes())?;
            std::fs::rename(&tmp, &target)
        };
        if let Err(e) = write() {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        written += 1;
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(id: &str) -> SimImage {
        SimImage { identifier: id.to_owned(), feature_tokens: 64, ..SimImage::default() }
    }

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "mmrouter-sim-ec-{tag}-{}-{:x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        dir
    }

    #[test]
    fn unsafe_names_are_hashed() {
        let dir = Path::new("/x");
        assert_eq!(path(dir, "abc-1_2.3"), Path::new("/x/abc-1_2.3.ec"));
        for name in ["../etc/passwd", "a/b", ".hidden", "", "ü", &"a".repeat(200)] {
            let p = path(dir, name);
            assert_eq!(p.parent(), Some(dir), "{name}");
            assert!(p.file_name().and_then(|f| f.to_str()).is_some_and(|f| f.starts_with("h-")), "{name}: {p:?}");
        }
        assert_ne!(path(dir, "a/b"), path(dir, "a/c"));
    }

    #[test]
    fn stored_images_are_present_once() {
        let dir = scratch("store");
        let images = [image("one"), image("two/evil")];
        assert_eq!(present(Some(&dir), &images), [false, false]);
        assert_eq!(store(&dir, &images[..1]).expect("store"), 1);
        assert_eq!(present(Some(&dir), &images), [true, false]);
        assert_eq!(store(&dir, &images).expect("store"), 1, "the first exists already");
        assert_eq!(present(Some(&dir), &images), [true, true]);
        assert_eq!(present(None, &images), [false, false]);
        let files = std::fs::read_dir(&dir).expect("list").count();
        assert_eq!(files, 2, "no temporary file left");
        let text = std::fs::read_to_string(path(&dir, "one")).expect("read");
        assert!(text.contains("\"num_encoder_tokens\":64"), "{text}");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn a_missing_directory_fails_the_store() {
        let dir = std::env::temp_dir().join(format!("mmrouter-sim-ec-missing-{:x}", rand::random::<u64>()));
        assert!(store(&dir, &[image("x")]).is_err());
    }
}
