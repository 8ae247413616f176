// A line diff (longest common subsequence over lines, common head and tail trimmed first).

/**
 * diffLines(a, b) -> [{op: " " | "-" | "+", text}] turning text a into text b.
 * Past ~4M line pairs (after trimming) the middle is reported as all removed then all added.
 */
export function diffLines(a, b) {
  const x = a.split("\n");
  const y = b.split("\n");
  let head = 0;
  while (head < x.length && head < y.length && x[head] === y[head]) head++;
  let tail = 0;
  while (tail < x.length - head && tail < y.length - head &&
    x[x.length - 1 - tail] === y[y.length - 1 - tail]) tail++;
  const xs = x.slice(head, x.length - tail);
  const ys = y.slice(head, y.length - tail);
  const out = [];
  for (let i = 0; i < head; i++) out.push({ op: " ", text: x[i] });
  if (xs.length * ys.length > 4_000_000) {
    for (const t of xs) out.push({ op: "-", text: t });
    for (const t of ys) out.push({ op: "+", text: t });
  } else {
    out.push(...lcs(xs, ys));
  }
  for (let i = x.length - tail; i < x.length; i++) out.push({ op: " ", text: x[i] });
  return out;
}

function lcs(xs, ys) {
  const n = xs.length;
  const m = ys.length;
  const w = m + 1;
  // L[i*w + j] = LCS length of xs[i:] and ys[j:]
  const L = new Uint32Array((n + 1) * w);
  for (let i = n - 1; i >= 0; i--) {
    for (let j = m - 1; j >= 0; j--) {
      L[i * w + j] = xs[i] === ys[j] ? L[(i + 1) * w + j + 1] + 1
        : Math.max(L[(i + 1) * w + j], L[i * w + j + 1]);
    }
  }
  const out = [];
  let i = 0;
  let j = 0;
  while (i < n && j < m) {
    if (xs[i] === ys[j]) { out.push({ op: " ", text: xs[i] }); i++; j++; }
    else if (L[(i + 1) * w + j] >= L[i * w + j + 1]) { out.push({ op: "-", text: xs[i] }); i++; }
    else { out.push({ op: "+", text: ys[j] }); j++; }
  }
  while (i < n) out.push({ op: "-", text: xs[i++] });
  while (j < m) out.push({ op: "+", text: ys[j++] });
  return out;
}
