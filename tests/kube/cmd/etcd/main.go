// Command etcd is the upstream etcd server's main (go.etcd.io/etcd/server/v3/etcdmain), built
// from the module pinned in go.mod for kubesink's real-server tests.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
