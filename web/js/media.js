// Attachments: which files the server reads, checks made before reading them, and the content parts they become.
//
// Media travels base64-encoded inside one WebSocket frame of at most MAX_FRAME_BYTES, so the whole message (text +
// every attachment, base64) must fit in it. The formats mirror modalities/ (image.py, audio.py, video.py) and the
// protocol's input_audio formats.

import { MAX_FRAME_BYTES, MAX_MEDIA_PER_TURN } from "./limits.js";

const FRAME_SLACK = 64 * 1024; // room left in the frame for the JSON around the media

const IMAGE_TYPES = {
  "image/jpeg": "image/jpeg",
  "image/jpg": "image/jpeg",
  "image/pjpeg": "image/jpeg",
  "image/png": "image/png",
  "image/webp": "image/webp",
  "image/avif": "image/avif",
};
const AUDIO_FORMATS = {
  "audio/wav": "wav",
  "audio/wave": "wav",
  "audio/x-wav": "wav",
  "audio/vnd.wave": "wav",
  "audio/mpeg": "mp3",
  "audio/mp3": "mp3",
  "audio/flac": "flac",
  "audio/x-flac": "flac",
  "audio/ogg": "ogg",
  "application/ogg": "ogg",
  "audio/opus": "opus",
  "audio/webm": "webm",
  "audio/mp4": "m4a",
  "audio/m4a": "m4a",
  "audio/x-m4a": "m4a",
};
const AUDIO_MIME = { wav: "audio/wav", mp3: "audio/mpeg", flac: "audio/flac", ogg: "audio/ogg", opus: "audio/ogg",
  webm: "audio/webm", m4a: "audio/mp4" }; // format -> MIME type for playing input_audio back
const VIDEO_TYPES = {
  "video/mp4": "video/mp4",
  "video/quicktime": "video/quicktime",
  "video/webm": "video/webm",
  "video/x-matroska": "video/x-matroska",
};
const BY_EXTENSION = {
  jpg: "image/jpeg", jpeg: "image/jpeg", png: "image/png", webp: "image/webp", avif: "image/avif",
  wav: "audio/wav", mp3: "audio/mpeg", flac: "audio/flac", ogg: "audio/ogg", oga: "audio/ogg", opus: "audio/opus",
  m4a: "audio/mp4", weba: "audio/webm",
  mp4: "video/mp4", m4v: "video/mp4", mov: "video/quicktime", webm: "video/webm", mkv: "video/x-matroska",
};

/** The value of the file picker's `accept` attribute. */
export const ACCEPT = [
  ...Object.keys(IMAGE_TYPES), ...Object.keys(AUDIO_FORMATS), ...Object.keys(VIDEO_TYPES),
  ...Object.keys(BY_EXTENSION).map((e) => `.${e}`),
].join(",");

const SUPPORTED = "JPEG, PNG, WebP or AVIF images; WAV, MP3, FLAC, OGG, Opus, WebM or M4A audio; " +
  "MP4, MOV, WebM or MKV video";

/**
 * What the server would make of a file: {kind: "image"|"audio"|"video", mime, format?} or {error}.
 * The MIME type the browser reports wins; the extension decides when it reports none (or a generic one).
 */
export function classify(name, type) {
  const ext = (/\.([A-Za-z0-9]+)$/.exec(name || "") || [])[1]?.toLowerCase();
  let mime = (type || "").split(";")[0].trim().toLowerCase();
  if (!mime || mime === "application/octet-stream") mime = BY_EXTENSION[ext] || mime;
  if (mime === "video/webm" && ext === "weba") mime = "audio/webm";
  if (IMAGE_TYPES[mime]) return { kind: "image", mime: IMAGE_TYPES[mime] };
  if (AUDIO_FORMATS[mime]) return { kind: "audio", mime, format: AUDIO_FORMATS[mime] };
  if (VIDEO_TYPES[mime]) return { kind: "video", mime: VIDEO_TYPES[mime] };
  const what = mime ? `a ${mime} file` : "a file of unknown type";
  return { error: `“${name}” is ${what}. You can attach ${SUPPORTED}.` };
}

/** Bytes of `n` bytes once base64-encoded. */
export function base64Size(n) {
  return 4 * Math.ceil(n / 3);
}

/** Attachment bytes (before base64) that fit one message besides `textChars` characters of text. */
export function mediaBudget(textChars = 0) {
  return Math.floor(((MAX_FRAME_BYTES - FRAME_SLACK - 3 * textChars) * 3) / 4);
}

/**
 * Check one more file against the files already attached. Returns null when it may be added, else a message.
 * `attached` is a list of {size}.
 */
export function checkFile(file, attached, textChars = 0) {
  const info = classify(file.name, file.type);
  if (info.error) return info.error;
  if (file.size === 0) return `“${file.name}” is empty.`;
  if (attached.length >= MAX_MEDIA_PER_TURN) {
    return `One message can carry at most ${MAX_MEDIA_PER_TURN} attachments.`;
  }
  const budget = mediaBudget(textChars);
  if (file.size > budget) {
    return `“${file.name}” is ${formatBytes(file.size)}; one message can carry at most ${formatBytes(budget)} ` +
      "of attachments.";
  }
  const used = attached.reduce((sum, a) => sum + a.size, 0);
  if (used + file.size > budget) {
    return `“${file.name}” (${formatBytes(file.size)}) does not fit: this message already carries ` +
      `${formatBytes(used)} of attachments, and the limit is ${formatBytes(budget)}.`;
  }
  return null;
}

/** Read a checked file into an attachment: {name, size, kind, mime, format, dataUrl, part}. */
export async function readAttachment(file) {
  const info = classify(file.name, file.type);
  if (info.error) throw new Error(info.error);
  const data = await readBase64(file);
  const dataUrl = `data:${info.mime};base64,${data}`;
  return { name: file.name, size: file.size, ...info, dataUrl, part: toPart(info, data, dataUrl) };
}

function toPart(info, data, dataUrl) {
  if (info.kind === "image") return { type: "image_url", image_url: { url: dataUrl } };
  if (info.kind === "audio") return { type: "input_audio", input_audio: { data, format: info.format } };
  return { type: "video_url", video_url: { url: dataUrl } };
}

function readBase64(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => {
      const url = String(reader.result);
      resolve(url.slice(url.indexOf(",") + 1));
    };
    reader.onerror = () => reject(new Error(`“${file.name}” could not be read.`));
    reader.readAsDataURL(file);
  });
}

/** The user content for text + attachments: a plain string when there are none (as the protocol allows). */
export function buildContent(text, attachments) {
  if (!attachments.length) return text;
  const parts = attachments.map((a) => a.part);
  if (text.trim()) parts.push({ type: "text", text });
  return parts;
}

/**
 * A content value (string or part list) as {text, media: [{kind, src, label}]}, with `src` usable as the source of
 * an <img>/<audio>/<video> only when it is a data: URL of the right kind (anything else is dropped).
 */
export function splitContent(content) {
  if (typeof content === "string") return { text: content, media: [] };
  const texts = [];
  const media = [];
  for (const part of Array.isArray(content) ? content : []) {
    if (part?.type === "text") texts.push(String(part.text ?? ""));
    else if (part?.type === "image_url") pushMedia(media, "image", part.image_url?.url, part);
    else if (part?.type === "video_url") pushMedia(media, "video", part.video_url?.url, part);
    else if (part?.type === "input_audio") {
      const mime = AUDIO_MIME[part.input_audio?.format] || "audio/wav";
      pushMedia(media, "audio", `data:${mime};base64,${part.input_audio?.data ?? ""}`, part);
    }
  }
  return { text: texts.join("\n"), media };
}

function pushMedia(media, kind, src, part) {
  const ok = typeof src === "string" && src.startsWith(`data:${kind}/`) && /^data:[\w.+/-]+;base64,/.test(src);
  media.push({ kind, src: ok ? src : null, part });
}

/** "1.4 MB", "820 KB", "12 bytes". */
export function formatBytes(n) {
  if (n < 1024) return `${n} bytes`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(n < 10 * 1024 ? 1 : 0)} KB`;
  if (n < 1024 ** 3) return `${(n / 1024 ** 2).toFixed(1)} MB`;
  return `${(n / 1024 ** 3).toFixed(2)} GB`;
}

/** A preview element for an attachment or a media part: <img>, <audio controls> or <video controls>. */
export function mediaElement(kind, src, label, doc = document) {
  if (!src) {
    const span = doc.createElement("span");
    span.className = "media-missing";
    span.textContent = `[${kind}]`;
    return span;
  }
  const el = doc.createElement(kind === "image" ? "img" : kind);
  el.src = src;
  el.className = `media media-${kind}`;
  if (kind === "image") {
    el.alt = label || "attached image";
  } else {
    el.controls = true;
    el.preload = "metadata";
    el.setAttribute("aria-label", label || `attached ${kind}`);
  }
  return el;
}
