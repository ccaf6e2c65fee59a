package clustersec

import (
	"fmt"
	"sort"
	"strings"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Roles that talk to Kafka, as ACLs names them.
const (
	RoleWorker  = "worker"  // shard workers: transactional producers
	RolePersist = "persist" // the persist consumer group
	RoleGateway = "gateway" // the gateway's /ops page (topic end offsets)
	RoleReader  = "reader"  // check and admin rebuild: read the topic without a group
	RoleInit    = "init"    // init: creates the topic
)

// Roles lists the roles ACLs knows, in a fixed order.
var Roles = []string{RoleWorker, RolePersist, RoleGateway, RoleReader, RoleInit}

// TransactionalIDPrefix is the prefix of every shard writer's transactional
// id (logrecord.TransactionalID).
const TransactionalIDPrefix = "chatpipe-vshard-"

// PersistGroup is persist's default consumer group.
const PersistGroup = "chatpipe-persist"

// ACL is one allow rule: operations on a resource.
type ACL struct {
	Resource kmsg.ACLResourceType // topic, group, transactional id or cluster
	Name     string               // the resource's name ("kafka-cluster" for the cluster)
	Prefixed bool                 // Name is a prefix, not a literal name
	Ops      []kmsg.ACLOperation
}

// ACLs returns the least-privilege allow rules of role for the log topic:
//
//   - worker: WRITE and READ (replay) on the topic; WRITE and DESCRIBE on
//     the transactional ids prefixed chatpipe-vshard-. A transactional
//     producer needs no IDEMPOTENT_WRITE on the cluster.
//   - persist: READ on the topic and on its own group.
//   - gateway: DESCRIBE on the topic (the /ops page reads end offsets).
//   - reader (check, admin rebuild): READ on the topic.
//   - init: CREATE and DESCRIBE on the topic, DESCRIBE_CONFIGS to check it.
//
// READ and WRITE imply DESCRIBE in Kafka, so it is not listed with them.
func ACLs(role, topic string) ([]ACL, error) {
	t := func(ops ...kmsg.ACLOperation) ACL {
		return ACL{Resource: kmsg.ACLResourceTypeTopic, Name: topic, Ops: ops}
	}
	group := func(g string) ACL {
		return ACL{Resource: kmsg.ACLResourceTypeGroup, Name: g, Ops: []kmsg.ACLOperation{kmsg.ACLOperationRead}}
	}
	switch role {
	case RoleWorker:
		return []ACL{
			t(kmsg.ACLOperationWrite, kmsg.ACLOperationRead),
			{Resource: kmsg.ACLResourceTypeTransactionalId, Name: TransactionalIDPrefix, Prefixed: true,
				Ops: []kmsg.ACLOperation{kmsg.ACLOperationWrite, kmsg.ACLOperationDescribe}},
		}, nil
	case RolePersist:
		return []ACL{t(kmsg.ACLOperationRead), group(PersistGroup)}, nil
	case RoleGateway:
		return []ACL{t(kmsg.ACLOperationDescribe)}, nil
	case RoleReader:
		return []ACL{t(kmsg.ACLOperationRead)}, nil
	case RoleInit:
		return []ACL{t(kmsg.ACLOperationCreate, kmsg.ACLOperationDescribe, kmsg.ACLOperationDescribeConfigs)}, nil
	}
	return nil, fmt.Errorf("clustersec: unknown role %q (one of %s)", role, strings.Join(Roles, ", "))
}

// Builder returns a kadm builder that allows a's operations to principal
// ("User:name") from any host, for kadm.Client.CreateACLs.
func (a ACL) Builder(principal string) *kadm.ACLBuilder {
	b := kadm.NewACLs().Allow(principal).AllowHosts().Operations(opsToKadm(a.Ops)...)
	pattern := kadm.ACLPatternLiteral
	if a.Prefixed {
		pattern = kadm.ACLPatternPrefixed
	}
	switch a.Resource {
	case kmsg.ACLResourceTypeTopic:
		b = b.Topics(a.Name)
	case kmsg.ACLResourceTypeGroup:
		b = b.Groups(a.Name)
	case kmsg.ACLResourceTypeTransactionalId:
		b = b.TransactionalIDs(a.Name)
	case kmsg.ACLResourceTypeCluster:
		b = b.Clusters()
	}
	return b.ResourcePatternType(pattern)
}

func opsToKadm(ops []kmsg.ACLOperation) []kadm.ACLOperation {
	out := make([]kadm.ACLOperation, len(ops))
	copy(out, ops)
	return out
}

// Command returns the kafka-acls.sh invocation that adds a for principal.
// bootstrap and commandConfig are put in as given (e.g. "$BROKERS" and
// "admin.properties").
func (a ACL) Command(principal, bootstrap, commandConfig string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "kafka-acls.sh --bootstrap-server %s --command-config %s --add --allow-principal %s", bootstrap, commandConfig, principal)
	ops := make([]string, len(a.Ops))
	for i, op := range a.Ops {
		ops[i] = opName(op)
	}
	sort.Strings(ops)
	for _, op := range ops {
		fmt.Fprintf(&b, " --operation %s", op)
	}
	switch a.Resource {
	case kmsg.ACLResourceTypeTopic:
		fmt.Fprintf(&b, " --topic %s", a.Name)
	case kmsg.ACLResourceTypeGroup:
		fmt.Fprintf(&b, " --group %s", a.Name)
	case kmsg.ACLResourceTypeTransactionalId:
		fmt.Fprintf(&b, " --transactional-id %s", a.Name)
	case kmsg.ACLResourceTypeCluster:
		b.WriteString(" --cluster")
	}
	if a.Prefixed {
		b.WriteString(" --resource-pattern-type prefixed")
	}
	return b.String()
}

// opName is an operation as kafka-acls.sh spells it (Write, DescribeConfigs, …).
func opName(op kmsg.ACLOperation) string {
	s := strings.ToLower(op.String()) // e.g. DESCRIBE_CONFIGS
	var b strings.Builder
	up := true
	for _, r := range s {
		if r == '_' {
			up = true
			continue
		}
		if up {
			b.WriteString(strings.ToUpper(string(r)))
			up = false
		} else {
			b.WriteRune(r)
		}
	}
	return b.String()
}
