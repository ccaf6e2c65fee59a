package logrecord

// UnmarshalLenient exposes unmarshalLenient to the tests.
var UnmarshalLenient = unmarshalLenient
