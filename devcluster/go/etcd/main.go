// Command etcd is the etcd server, built from its module through this wrapper
// because server/go.mod carries replace lines that `go install pkg@version` refuses.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
