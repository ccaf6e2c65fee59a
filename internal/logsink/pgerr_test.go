package logsink

import "github.com/jackc/pgx/v5/pgconn"

var (
	pgconnError22021 = pgconn.PgError{Code: "22021", Message: `invalid byte sequence for encoding "UTF8": 0x00`}
	pgconnError54000 = pgconn.PgError{Code: "54000", Message: "index row size exceeds maximum"}
	pgconnError40001 = pgconn.PgError{Code: "40001", Message: "could not serialize access"}
	pgconnError23505 = pgconn.PgError{Code: "23505", Message: "duplicate key value"}
)
