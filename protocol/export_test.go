package protocol

// DecodeLenient exposes decodeLenient to the tests, which check that the
// fast path agrees with it.
var DecodeLenient = decodeLenient
