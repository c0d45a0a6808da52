//! What the simulator is told about a request's prompt ([`SimPrompt`], its image runs [`SimImage`]) and
//! the seam that tells it ([`Prompter`]): the server knows no template or tokenizer, only this.

/// What a [`Prompter`] tells the simulator about one request's prompt.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SimPrompt {
    /// Tokens the model would see (images expanded).
    pub prompt_tokens: u32,
    /// Chained keys of the prompt's full blocks, in order (a key encodes its whole prefix).
    pub block_keys: Vec<u64>,
    /// The token ids the blocks are cut from. Empty when the prompter does not know them: the request
    /// is then cached but announces nothing in KV events.
    pub token_ids: Vec<u32>,
    /// Where each image's tokens sit in `token_ids`, in prompt order.
    pub images: Vec<SimImage>,
    /// The request's `cache_salt` (enters the first block's extra keys, as in vLLM).
    pub cache_salt: Option<String>,
}

/// One image run of a prompt, with the name the simulated engine gives it in KV events.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SimImage {
    /// First token of the run.
    pub offset: u32,
    /// Tokens in the run.
    pub len: u32,
    /// The client's `uuid` verbatim when the part carried one (as vLLM does), else the engine's own hash.
    pub identifier: String,
    /// Encoder (feature) tokens of the image: what the vision encoder outputs and the image caches
    /// are sized by (the run's `len` for the Qwen family; less where the run adds wrapper tokens).
    pub feature_tokens: u32,
    /// The image's size in pixels, as its header says (the encoder's `image_grid_thw` metadata).
    pub width: u32,
    pub height: u32,
}

/// Turns a request into the prompt the simulated model sees.
pub trait Prompter: Send + Sync + 'static {
    /// `path` is "/v1/chat/completions" or "/v1/completions"; `raw` are the exact body bytes of which
    /// `body` is the parse. An `Err` is answered 400 with the message.
    fn prompt(&self, path: &str, body: &serde_json::Value, raw: &[u8], block_size: usize) -> Result<SimPrompt, String>;

    /// The text of `ids` as the model's tokenizer decodes it (`/detokenize`); `Err` when this
    /// prompter knows no tokenizer.
    fn decode(&self, _ids: &[u32]) -> Result<String, String> {
        Err("this simulator's prompter knows no tokenizer".to_owned())
    }

    /// Each id's token string (`/tokenize`'s `token_strs`, transformers' `convert_ids_to_tokens`).
    fn id_tokens(&self, _ids: &[u32]) -> Result<Vec<String>, String> {
        Err("this simulator's prompter knows no tokenizer".to_owned())
    }
}
