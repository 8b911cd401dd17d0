module taugrid.dev/devcluster/pause

go 1.26.0
