// A Delta version's files and which of them may hold a batch's key values, decided in the driver's
// JVM from the log's per-file statistics: no Spark job, and no statistic (a key's prefix) crosses
// into Python. Compiled at run time by lake/bridge.py (Janino); see DeltaTable.files_for_keys.
package lakehouse_dsr;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.Comparator;
import java.util.Iterator;
import java.util.List;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.delta.actions.AddFile;

public class DeltaStats {
    private static final ObjectMapper JSON = new ObjectMapper();

    /**
     * [[path, size, rows or null, may hold, masked by a deletion vector]] of each file in `adds`
     * (AddFile actions), as JSON. A file
     * may hold the values when, for some key column (`paths` item i: its path in the statistics, dotted;
     * `values` item i: its values, String, Long or Integer), one value lies within the file's
     * minimum and maximum, or the file has no statistics for the column. `values` item i may instead
     * be a Row of the values' minimum and maximum (a set too large to hold here): the file may hold
     * them when its bounds overlap that range. Strings compare as UTF-8 bytes, as Spark and Delta's
     * own data skipping order them (a maximum cut to 32 characters is raised past the values it
     * stands for, a cut minimum is a prefix of the minimum).
     */
    public String files(List adds, List paths, List values) throws Exception {
        // sorted in the order of the statistics (a TreeMap's strings are in UTF-16 order, not UTF-8's)
        List sortedValues = new ArrayList();
        for (int i = 0; i < values.size(); i++) {
            if (values.get(i) instanceof Row) {
                Row span = (Row) values.get(i);
                sortedValues.add(span.isNullAt(0) ? Collections.emptyList() : span);
                continue;
            }
            List copy = new ArrayList((List) values.get(i));
            Collections.sort(copy, new Comparator() {
                public int compare(Object a, Object b) {
                    return a instanceof String ? utf8((String) a, (String) b)
                        : Long.compare(((Number) a).longValue(), ((Number) b).longValue());
                }
            });
            sortedValues.add(copy);
        }
        List out = new ArrayList();
        for (Iterator it = adds.iterator(); it.hasNext();) {
            AddFile add = (AddFile) it.next();
            String raw = add.stats();
            JsonNode stats = raw == null ? null : JSON.readTree(raw);
            boolean may = false;
            for (int i = 0; i < paths.size() && !may; i++) {
                Object wanted = sortedValues.get(i);
                may = wanted instanceof Row ? overlaps(stats, (String) paths.get(i), (Row) wanted)
                    : mayHold(stats, (String) paths.get(i), (List) wanted);
            }
            Long rows = null;
            if (stats != null && stats.has("numRecords")) {
                long deleted = add.deletionVector() == null ? 0L : add.deletionVector().cardinality();
                rows = Long.valueOf(stats.get("numRecords").asLong() - deleted);
            }
            out.add(new Object[] {add.path(), Long.valueOf(add.size()), rows, Boolean.valueOf(may),
                Boolean.valueOf(add.deletionVector() != null)});
        }
        return JSON.writeValueAsString(out);
    }

    /** The items of `adds` at `indexes` (Integers), in that order. */
    public List pick(List adds, List indexes) {
        List out = new ArrayList();
        for (int i = 0; i < indexes.size(); i++) {
            out.add(adds.get(((Number) indexes.get(i)).intValue()));
        }
        return out;
    }

    private static boolean mayHold(JsonNode stats, String path, List sorted) {
        if (sorted.isEmpty()) {
            return false;
        }
        JsonNode low = at(stats, "minValues", path);
        JsonNode high = at(stats, "maxValues", path);
        if (!comparable(sorted.get(0), low) || !comparable(sorted.get(0), high)) {
            return true;  // no statistic for the column (or not one of the key's type): may hold any value
        }
        // the first value not below the minimum, then whether it is within the maximum
        int lo = 0;
        int hi = sorted.size();
        while (lo < hi) {
            int mid = (lo + hi) >>> 1;
            if (compare(sorted.get(mid), low) < 0) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        return lo < sorted.size() && compare(sorted.get(lo), high) <= 0;
    }

    /** Whether the file's bounds overlap [span's first, span's last] (a file without them: may hold any). */
    private static boolean overlaps(JsonNode stats, String path, Row span) {
        JsonNode low = at(stats, "minValues", path);
        JsonNode high = at(stats, "maxValues", path);
        Object first = span.get(0);
        Object last = span.get(1);
        if (!comparable(first, low) || !comparable(first, high)) {
            return true;
        }
        return compare(last, low) >= 0 && compare(first, high) <= 0;
    }

    private static JsonNode at(JsonNode stats, String kind, String path) {
        JsonNode node = stats == null ? null : stats.get(kind);
        String[] parts = path.split("\\.");
        for (int i = 0; i < parts.length && node != null; i++) {
            node = node.get(parts[i]);
        }
        return node;
    }

    /** Strings in the order of their UTF-8 bytes (Spark's and Delta's). */
    private static int utf8(String x, String y) {
        byte[] a = x.getBytes(StandardCharsets.UTF_8);
        byte[] b = y.getBytes(StandardCharsets.UTF_8);
        int n = Math.min(a.length, b.length);
        for (int i = 0; i < n; i++) {
            int d = (a[i] & 0xff) - (b[i] & 0xff);
            if (d != 0) {
                return d;
            }
        }
        return a.length - b.length;
    }

    private static boolean comparable(Object value, JsonNode bound) {
        return bound != null && (value instanceof String ? bound.isTextual() : bound.isIntegralNumber());
    }

    /** A value against a statistic of its type (`comparable`): <0, 0, >0. */
    private static int compare(Object value, JsonNode bound) {
        if (value instanceof String) {
            return utf8((String) value, bound.asText());
        }
        return Long.compare(((Number) value).longValue(), bound.asLong());
    }
}
