package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/chatpipe/chatpipe/internal/clustersec"
	"github.com/chatpipe/chatpipe/logrecord"
)

// newKafkaACLsCommand makes chatpipe admin kafka-acls, which prints the
// kafka-acls.sh commands that grant each role its least-privilege ACLs
// (clustersec.ACLs).
func newKafkaACLsCommand() *command {
	fs := newFlagSet("admin kafka-acls")
	topic := fs.String("topic", logrecord.DefaultTopic, "log topic")
	bootstrap := fs.String("bootstrap-server", "$BROKERS", "--bootstrap-server of the printed commands")
	config := fs.String("command-config", "admin.properties", "--command-config of the printed commands (the admin's TLS and SASL settings)")
	role := fs.String("role", "", "print only this role's: "+fmt.Sprint(clustersec.Roles))
	principal := fs.String("principal", "", "principal of --role (default User:chatpipe-ROLE)")
	return newCommand(fs, "print the kafka-acls.sh commands granting each role its least-privilege ACLs", func(_ context.Context, _ []string) error {
		roles := clustersec.Roles
		if *role != "" {
			roles = []string{*role}
		} else if *principal != "" {
			return fmt.Errorf("--principal needs --role")
		}
		return printKafkaACLs(os.Stdout, roles, *principal, *topic, *bootstrap, *config)
	})
}

func printKafkaACLs(w io.Writer, roles []string, principal, topic, bootstrap, config string) error {
	for _, r := range roles {
		acls, err := clustersec.ACLs(r, topic)
		if err != nil {
			return err
		}
		p := principal
		if p == "" {
			p = "User:chatpipe-" + r
		}
		fmt.Fprintf(w, "# %s\n", r)
		for _, a := range acls {
			fmt.Fprintln(w, a.Command(p, bootstrap, config))
		}
	}
	return nil
}
