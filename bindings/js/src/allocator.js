// The JS runtime's allocator over a module's linear memory: everything from __heap_base to the end of memory
// is ours (WASM_ABI.md). First fit over a sorted free list of 64-byte-aligned blocks, coalesced on free;
// memory.grow when nothing fits.
const PAGE = 65536;
export const ALIGN = 64;

function alignUp(n, a) {
  return Math.ceil(n / a) * a;
}

export class OutOfMemory extends Error {
  constructor(message) {
    super(message);
    this.name = "OutOfMemory";
  }
}

export class Allocator {
  /** `memory` a WebAssembly.Memory; `base` the first byte we may use (__heap_base). */
  constructor(memory, base, label = "module") {
    this.memory = memory;
    this.label = label;
    this.base = alignUp(Math.max(base, ALIGN), ALIGN); // never hand out 0: a NULL data pointer is an error
    this.end = this.base; // the end of the heap we manage (grows with memory)
    this.free_ = []; // [{start, size}] sorted by start, never adjacent (coalesced)
    this.used = new Map(); // start -> size
    this._extend(memory.buffer.byteLength);
  }

  _extend(newEnd) {
    if (newEnd > this.end) {
      this._insert(this.end, newEnd - this.end);
      this.end = newEnd;
    }
  }

  _insert(start, size) {
    const list = this.free_;
    let lo = 0;
    let hi = list.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (list[mid].start < start) lo = mid + 1;
      else hi = mid;
    }
    const prev = lo > 0 ? list[lo - 1] : null;
    const next = lo < list.length ? list[lo] : null;
    if (prev && prev.start + prev.size === start) {
      prev.size += size;
      if (next && prev.start + prev.size === next.start) {
        prev.size += next.size;
        list.splice(lo, 1);
      }
    } else if (next && start + size === next.start) {
      next.start = start;
      next.size += size;
    } else {
      list.splice(lo, 0, { start, size });
    }
  }

  /** A 64-byte-aligned block of at least `nbytes` (at least 64: never a NULL or shared pointer). */
  alloc(nbytes) {
    const size = alignUp(Math.max(Number(nbytes), 1), ALIGN);
    if (!Number.isSafeInteger(size)) throw new OutOfMemory(`${this.label}: cannot allocate ${nbytes} bytes`);
    for (let k = 0; k < this.free_.length; k++) {
      const blk = this.free_[k];
      if (blk.size >= size) {
        const start = blk.start;
        if (blk.size === size) this.free_.splice(k, 1);
        else {
          blk.start += size;
          blk.size -= size;
        }
        this.used.set(start, size);
        return start;
      }
    }
    // grow: what the last free block (if it ends the heap) lacks, in whole pages
    const last = this.free_.length ? this.free_[this.free_.length - 1] : null;
    const tail = last && last.start + last.size === this.end ? last.size : 0;
    const pages = Math.ceil((size - tail) / PAGE);
    try {
      this.memory.grow(pages);
    } catch (exc) {
      throw new OutOfMemory(`${this.label}: out of memory: cannot grow linear memory by ${pages} pages to hold ${size} bytes (${exc.message})`);
    }
    this._extend(this.memory.buffer.byteLength);
    return this.alloc(nbytes);
  }

  /** Make sure `nbytes` more can be allocated without growing memory again (one grow for many blocks). */
  reserve(nbytes) {
    const last = this.free_.length ? this.free_[this.free_.length - 1] : null;
    const tail = last && last.start + last.size === this.end ? last.size : 0;
    const need = alignUp(Number(nbytes), ALIGN) - tail;
    if (need <= 0) return;
    const pages = Math.ceil(need / PAGE);
    try {
      this.memory.grow(pages);
    } catch (exc) {
      throw new OutOfMemory(`${this.label}: out of memory: cannot grow linear memory by ${pages} pages to hold ${nbytes} bytes (${exc.message})`);
    }
    this._extend(this.memory.buffer.byteLength);
  }

  free(ptr) {
    const size = this.used.get(ptr);
    if (size === undefined) throw new Error(`${this.label}: free of ${ptr}, which is not an allocated block`);
    this.used.delete(ptr);
    this._insert(ptr, size);
  }

  /** Bytes in use and free (for tests and diagnostics). */
  stats() {
    let used = 0;
    for (const s of this.used.values()) used += s;
    let free = 0;
    for (const b of this.free_) free += b.size;
    return { used, free, blocks: this.used.size, freeBlocks: this.free_.length, heapBytes: this.end - this.base };
  }
}
