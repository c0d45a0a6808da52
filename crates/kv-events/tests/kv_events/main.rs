//! mmrouter-kv-events against the engines' own encodings: `fixtures` (committed payloads written by
//! msgspec as each vLLM / SGLang version declares its structs) and `interop_libzmq` (a real libzmq
//! publisher and replay router). One test binary: each binary links the whole dependency graph again.

mod fixtures;
mod interop_libzmq;
