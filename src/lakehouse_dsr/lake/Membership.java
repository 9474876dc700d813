// Whether a row's key is one of a batch's values, tested inside Spark's generated code for
// lakehouse-dsr (membership.py): a hash set lookup where a broadcast join would build a key row, hash
// it and probe a hashed relation for every row. Spark's stock Invoke calls `test` through
// java.util.function.Predicate (a bigint or int key boxed), so generated code names no class of ours; the values travel as a broadcast
// variable (fetched once per executor, cached per deserialized copy), never as plan literals, and
// the literal's text is "membership", so no value reaches a plan string. Compiled by Janino
// (bridge.py): raw types throughout.
package lakehouse_dsr;

import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.function.Predicate;
import org.apache.spark.SparkContext;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.broadcast.Broadcast;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.catalyst.expressions.Literal;
import org.apache.spark.sql.catalyst.expressions.objects.Invoke;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.ObjectType;
import org.apache.spark.unsafe.types.UTF8String;

public class Membership implements Predicate, java.io.Serializable {
  private final Broadcast values;
  private transient Set held;  // the broadcast's set: TorrentBroadcast.value() synchronizes every call

  public Membership() { this.values = null; }

  private Membership(Broadcast values) { this.values = values; }

  private Set held() {
    if (held == null) {
      held = (Set) values.value();
    }
    return held;
  }

  /** A UTF8String, Long or Integer key. */
  public boolean test(Object value) { return held().contains(value); }

  public String toString() { return "membership"; }

  /** A boolean column: whether `key` (of `type`: "string", "bigint" or "int") is one of `values`
   *  (Java strings, longs or integers), NULL where `key` is NULL. Deterministic: Spark may move it
   *  like any predicate. */
  public Column of(SparkContext sc, List values, Column key, String type) {
    HashSet set = new HashSet(values.size() * 2);
    if (type.equals("string")) {
      for (int i = 0; i < values.size(); i++) {
        set.add(UTF8String.fromString((String) values.get(i)));
      }
    } else if (type.equals("bigint")) {
      for (int i = 0; i < values.size(); i++) {
        set.add(Long.valueOf(((Number) values.get(i)).longValue()));
      }
    } else if (type.equals("int")) {
      for (int i = 0; i < values.size(); i++) {
        set.add(Integer.valueOf(((Number) values.get(i)).intValue()));
      }
    } else {
      throw new IllegalArgumentException("no membership test for keys of type " + type);
    }
    Broadcast shared = new JavaSparkContext(sc).broadcast(set);
    List arguments = new ArrayList();
    arguments.add(key.expr());
    return new Column(new Invoke(new Literal(new Membership(shared), new ObjectType(Predicate.class)), "test",
        DataTypes.BooleanType, seq(arguments), seq(new ArrayList()), true, true, true));
  }

  private static scala.collection.Seq seq(List items) {
    return scala.collection.JavaConverters.asScalaBuffer(items).toSeq();
  }
}
