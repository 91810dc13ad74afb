// The protocol limits the page checks before sending, copied from chat/protocol/limits.py
// (tests/web/test_static.py fails when the two disagree).

export const MAX_FRAME_BYTES = 16777216; // one client frame, UTF-8 bytes, media included (base64)
export const MAX_TEXT_CHARS = 262144; // text of one message; also the system prompt
export const MAX_MEDIA_PER_TURN = 16; // image / audio / video items in one turn
export const MAX_TEMPERATURE = 5.0; // temperature is in [0, MAX_TEMPERATURE]
export const MAX_TOP_K = 1000000; // top_k is in [0, MAX_TOP_K]
export const MAX_REPLY_TOKENS = 32768; // max_tokens is in [1, MAX_REPLY_TOKENS]
export const AUDIO_FORMATS = ["wav", "mp3", "flac", "ogg", "opus", "webm", "m4a"]; // input_audio.format values
