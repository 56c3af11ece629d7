module github.com/chimera-k8s/chimera/images/test/pause

go 1.26.0
