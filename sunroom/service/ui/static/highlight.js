// A small Python syntax highlighter: returns a DocumentFragment of text nodes and <span class="hl-*">
// elements (built with createElement; the code is never parsed as HTML).

const KEYWORDS = new Set(("False None True and as assert async await break class continue def del " +
  "elif else except finally for from global if import in is lambda nonlocal not or pass raise " +
  "return try while with yield match case type").split(" "));
const BUILTINS = new Set(("abs all any ascii bin bool breakpoint bytearray bytes callable chr " +
  "classmethod compile complex delattr dict dir divmod enumerate filter float format frozenset " +
  "getattr globals hasattr hash help hex id input int isinstance issubclass iter len list locals " +
  "map max memoryview min next object oct open ord pow print property range repr reversed round " +
  "set setattr slice sorted staticmethod str sum super tuple vars zip self cls Exception " +
  "ValueError TypeError KeyError IndexError RuntimeError").split(" "));

// One alternation, sticky: each branch is a token class; anything else is plain text.
const TOKEN = new RegExp([
  "(#[^\\n]*)",                                                              // 1 comment
  "((?:[rRbBuUfF]{0,2})(?:'''[\\s\\S]*?(?:'''|$(?![\\s\\S]))|\"\"\"[\\s\\S]*?(?:\"\"\"|$(?![\\s\\S]))))", // 2 triple string
  "((?:[rRbBuUfF]{0,2})(?:'(?:[^'\\\\\\n]|\\\\.)*'?|\"(?:[^\"\\\\\\n]|\\\\.)*\"?))", // 3 string
  "(\\b(?:0[xX][0-9a-fA-F_]+|0[oO][0-7_]+|0[bB][01_]+|(?:\\d[\\d_]*\\.?[\\d_]*|\\.\\d[\\d_]*)(?:[eE][+-]?\\d+)?j?)\\b)", // 4 number
  "(@[A-Za-z_][\\w.]*)",                                                     // 5 decorator
  "([A-Za-z_]\\w*)",                                                         // 6 name
].join("|"), "y");

const CLASSES = [null, "hl-comment", "hl-string", "hl-string", "hl-number", "hl-decorator"];

/** Python source -> a DocumentFragment with highlight spans. */
export function highlight(code) {
  const frag = document.createDocumentFragment();
  let plain = "";
  let prevName = "";
  const flush = () => {
    if (plain) { frag.appendChild(document.createTextNode(plain)); plain = ""; }
  };
  const span = (cls, text) => {
    flush();
    const s = document.createElement("span");
    s.className = cls;
    s.textContent = text;
    frag.appendChild(s);
  };
  let i = 0;
  const n = code.length;
  while (i < n) {
    const ch = code[i];
    // quick path for characters that cannot start a token
    if (!/[#'"0-9.@A-Za-z_]/.test(ch)) { plain += ch; i++; continue; }
    TOKEN.lastIndex = i;
    const m = TOKEN.exec(code);
    if (!m || m[0].length === 0) { plain += ch; i++; continue; }
    const text = m[0];
    if (m[6] !== undefined) {
      if (KEYWORDS.has(text)) span("hl-keyword", text);
      else if (prevName === "def" || prevName === "class") span("hl-def", text);
      else if (BUILTINS.has(text)) span("hl-builtin", text);
      else plain += text;
      prevName = text;
    } else {
      let k = 1;
      while (m[k] === undefined) k++;
      span(CLASSES[k], text);
      prevName = "";
    }
    i += text.length;
  }
  flush();
  return frag;
}
