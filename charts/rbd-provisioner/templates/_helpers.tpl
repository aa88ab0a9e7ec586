{{/*
Object names are those of deploy/: the chart installs one provisioner and one CSI driver per
cluster (its ClusterRoles and the CSIDriver are cluster-wide).
*/}}
{{- define "rbd-provisioner.controllerName" -}}rbd-provisioner{{- end }}
{{- define "rbd-provisioner.nodeName" -}}rbd-csi-node{{- end }}
{{/* The CSI driver's name, as the binary defaults it (--driver-name, --csi-driver-name). */}}
{{- define "rbd-provisioner.driverName" -}}rbd.provisioner.ceph.io{{- end }}

{{/* repository:tag of one of .Values.image's entries */}}
{{- define "rbd-provisioner.image" -}}
{{- printf "%s:%s" .repository (toString .tag) }}
{{- end }}

{{/* --topology-labels=... when topologyLabels is set */}}
{{- define "rbd-provisioner.topologyArg" -}}
{{- with .Values.topologyLabels }}
- --topology-labels={{ join "," . }}
{{- end }}
{{- end }}

{{/* the scheduling fields shared by both pods, from a controller or csi.node entry */}}
{{- define "rbd-provisioner.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end }}
