module github.com/chimera-k8s/chimera

go 1.26
