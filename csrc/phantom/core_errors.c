/* Error names and messages. The names come from the headers the fake was
 * built against (every code of that CUDA version); the messages are the
 * real runtime's wording for the codes a test is likely to meet, so that
 * PyTorch's "CUDA error: out of memory" reads as it does on a GPU. Other
 * codes get their name as their message.
 */
#include "core.h"

#include <stdlib.h>
#include <string.h>

static const struct vgfc_error_name messages[] = {
    {0, "no error"},
    {1, "invalid argument"},
    {2, "out of memory"},
    {3, "initialization error"},
    {4, "driver shutting down"},
    {12, "invalid pitch argument"},
    {21, "invalid copy direction for memcpy"},
    {100, "no CUDA-capable device is detected"},
    {101, "invalid device ordinal"},
    {209, "no kernel image is available for execution on the device"},
    {400, "invalid resource handle"},
    {500, "named symbol not found"},
    {600, "device not ready"},
    {700, "an illegal memory access was encountered"},
    {701, "too many resources requested for launch"},
    {704, "peer access is already enabled"},
    {710, "device-side assert triggered"},
    {712, "part or all of the requested memory range is already mapped"},
    {713, "pointer does not correspond to a registered memory region"},
    {719, "unspecified launch failure"},
    {801, "operation not supported"},
    {999, "unknown error"},
};

static const char *lookup(const struct vgfc_error_name *table, int n, int code)
{
    for (int i = 0; i < n; i++)
        if (table[i].code == code)
            return table[i].name;
    return NULL;
}

const char *vgfc_runtime_error_name(int code)
{
    return lookup(vgfc_runtime_error_names, vgfc_runtime_error_name_count, code);
}

const char *vgfc_driver_error_name(int code)
{
    return lookup(vgfc_driver_error_names, vgfc_driver_error_name_count, code);
}

const char *vgfc_error_message(int code)
{
    return lookup(messages, (int)(sizeof messages / sizeof messages[0]), code);
}

static int code_of(const struct vgfc_error_name *table, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(table[i].name, name) == 0)
            return table[i].code;
    return -1;
}

int vgfc_parse_error(const char *text)
{
    char *end;
    long code = strtol(text, &end, 10);
    if (end != text && *end == 0)
        return code < 0 || code > 1000000 ? -1 : (int)code;
    int c = code_of(vgfc_runtime_error_names, vgfc_runtime_error_name_count, text);
    return c >= 0 ? c : code_of(vgfc_driver_error_names, vgfc_driver_error_name_count, text);
}
