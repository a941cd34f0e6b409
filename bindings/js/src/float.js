// A number that must travel as a float even when it is integral (2.0): a packed call passes it as FLOAT64
// (a plain JS number that is an integer goes as INT64), and msgpack encoders write it as a float.
export class Float64 {
  constructor(value) {
    this.value = Number(value);
  }

  valueOf() {
    return this.value;
  }

  toString() {
    return String(this.value);
  }

  toJSON() {
    return this.value;
  }
}
