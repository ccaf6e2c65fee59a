package logsink

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// DeadLetter is one row of dead_letters: a record a consumer could never
// write, and why.
type DeadLetter struct {
	Consumer, Topic string
	Partition       int32
	Offset          int64
	Conversation    string // "" when the record did not decode
	Seq             int64  // 0 when the record did not decode
	SQLState        string // "" when Postgres did not refuse it
	CreatedAt       time.Time
	Error           string
	Value           []byte
}

// ListDeadLetters returns up to limit rows of dead_letters, oldest first,
// of consumer ("" for all), and how many there are in all.
func ListDeadLetters(ctx context.Context, q Querier, consumer string, limit int) ([]DeadLetter, int64, error) {
	total, err := CountDeadLetters(ctx, q, consumer)
	if err != nil {
		return nil, 0, err
	}
	rows, err := q.Query(ctx, `SELECT consumer, topic, log_partition, log_offset, coalesce(conversation_id, ''), coalesce(seq, 0),
		coalesce(sqlstate, ''), created_at, error, coalesce(record_value, ''::bytea)
		FROM dead_letters WHERE $1 = '' OR consumer = $1
		ORDER BY created_at, consumer, topic, log_partition, log_offset LIMIT $2`, consumer, limit)
	if err != nil {
		return nil, 0, fmt.Errorf("read dead letters: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadLetter, error) {
		var d DeadLetter
		err := r.Scan(&d.Consumer, &d.Topic, &d.Partition, &d.Offset, &d.Conversation, &d.Seq, &d.SQLState, &d.CreatedAt, &d.Error, &d.Value)
		return d, err
	})
	if err != nil {
		return nil, 0, fmt.Errorf("read dead letters: %w", err)
	}
	return out, total, nil
}
